"""Culprit localization by adaptive group testing.

A collective runs at the speed of its slowest member, so one bad node (or one bad uplink) makes
every group it is in look bad. :class:`Localizer` finds the culprits: a group that underperforms
is split in two along leaf boundaries, both halves are tested in parallel, a half that passes
clears its nodes, a half that fails is split again; a half of one node is tested together with a
known-good partner (from the same leaf when possible). When a group fails but both of its halves
pass, the fault lies *between* the halves: the leaf-to-leaf path, pinned to one leaf's uplinks
when a known-good third leaf is available to compare with.

With ``k`` culprits among ``n`` nodes it uses at most about ``1 + 2 k log2(n)`` collective runs
(every round's tests run at the same time, on disjoint nodes), instead of ``n`` pair tests.
Everything here works against an injectable ``run_collective(nodes) -> busbw``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import hostlist

from gpuforge.validate.result import CheckResult, FabricFinding, Level, Status

Group = tuple[str, ...]
RunCollective = Callable[[Group], float]


@dataclass(frozen=True)
class CollectiveRun:
    """One collective run of the localization."""

    label: str
    nodes: Group
    busbw_gbs: float
    floor_gbs: float

    @property
    def passed(self) -> bool:
        """At or above the floor."""
        return self.busbw_gbs >= self.floor_gbs


@dataclass(frozen=True)
class Localization:
    """What the group testing concluded."""

    culprits: tuple[str, ...]
    findings: tuple[FabricFinding, ...]
    runs: tuple[CollectiveRun, ...]
    cleared: tuple[str, ...]
    unresolved: tuple[str, ...] = ()

    @property
    def run_count(self) -> int:
        """Number of collective runs used."""
        return len(self.runs)

    @property
    def rounds(self) -> int:
        """Number of rounds (a round's runs go in parallel), i.e. the wall-clock cost."""
        return len({r.label.split(":", 1)[0] for r in self.runs})


@dataclass
class Localizer:
    """Adaptive group testing over ``run`` (see the module docstring).

    ``leaf_of`` maps a node to its leaf-group key (the tuple of its leaves, one per rail, as a
    string; for a one-rail test, the node's leaf on that rail); ``floor`` gives the passing busbw
    for a group (a number or a function of the group). ``rail`` is the one rail a per-rail test
    runs on (None: all rails): its leaf findings name that rail's switches.
    """

    run: RunCollective
    floor: float | Callable[[Group], float]
    leaf_of: Mapping[str, str] = field(default_factory=dict)
    max_parallel: int = 16
    runs: list[CollectiveRun] = field(default_factory=list)
    good: set[str] = field(default_factory=set)
    rail: int | None = None
    _round: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def leaf(self, node: str) -> str:
        """The leaf-group key of ``node`` (the node itself when the topology is unknown)."""
        return self.leaf_of.get(node, "")

    def floor_for(self, group: Group) -> float:
        """The passing busbw for ``group``."""
        return self.floor(group) if callable(self.floor) else float(self.floor)

    def test_round(self, groups: Sequence[Group], what: str = "test") -> list[CollectiveRun]:
        """Run every group of a round in parallel (the groups must be disjoint)."""
        self._round += 1
        label = f"r{self._round}:{what}"
        seen: set[str] = set()
        for g in groups:
            if seen & set(g):
                raise ValueError(f"round {self._round}: groups overlap on {sorted(seen & set(g))}")
            seen |= set(g)
        workers = max(1, min(self.max_parallel, len(groups)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            values = list(pool.map(self.run, groups))
        done = [
            CollectiveRun(label, g, float(v), self.floor_for(g))
            for g, v in zip(groups, values, strict=True)
        ]
        with self._lock:
            self.runs.extend(done)
            for r in done:
                if r.passed:
                    self.good.update(r.nodes)
        return done

    # --- splitting -------------------------------------------------------------------------

    def split(self, group: Group) -> tuple[Group, Group]:
        """Two halves of ``group``: whole leaf groups when it spans several leaves, else nodes."""
        by_leaf: dict[str, list[str]] = {}
        for n in group:
            by_leaf.setdefault(self.leaf(n), []).append(n)
        if len(by_leaf) > 1:
            leaves = sorted(by_leaf)
            total, acc, cut = len(group), 0, len(leaves) - 1
            for i, leaf in enumerate(leaves[:-1]):
                acc += len(by_leaf[leaf])
                if acc * 2 >= total:
                    cut = i + 1
                    break
            first = tuple(n for lf in leaves[:cut] for n in by_leaf[lf])
            second = tuple(n for lf in leaves[cut:] for n in by_leaf[lf])
            return first, second
        half = (len(group) + 1) // 2
        return group[:half], group[half:]

    def partner(self, node: str, busy: set[str], *, same_leaf_only: bool = False) -> str | None:
        """A known-good node not busy this round, from ``node``'s leaf when there is one."""
        leaf = self.leaf(node)
        pool = sorted(self.good - busy - {node})
        same = [p for p in pool if self.leaf(p) == leaf]
        if same:
            return same[0]
        if same_leaf_only:
            return None
        return pool[0] if pool else None

    # --- the algorithm ---------------------------------------------------------------------

    def localize(self, nodes: Iterable[str], *, what: str = "batch") -> Localization:
        """Test ``nodes`` as one group and, if it underperforms, find who is to blame."""
        group = tuple(nodes)
        if not group:
            return Localization((), (), tuple(self.runs), ())
        first = self.test_round([group], what)[0]
        if first.passed:
            return Localization((), (), tuple(self.runs), group)
        culprits: list[str] = []
        findings: list[FabricFinding] = []
        unresolved: list[str] = []
        failing: list[Group] = [group]
        pending: list[tuple[Group, str]] = []  # (parent, single suspect) awaiting a partner
        outcome: dict[Group, list[bool]] = {}  # parent -> pass/fail of its halves so far
        while failing or pending:
            plan, pending = self._plan_round(failing, pending)
            if not plan:
                unresolved.extend(s for _, s in pending)
                break
            results = {r.nodes: r for r in self.test_round([t for _, _, t in plan])}
            failing = []
            for parent, half, tested in plan:
                run = results[tested]
                outcome.setdefault(parent, []).append(run.passed)
                if run.passed:
                    continue
                if len(half) >= 2:
                    failing.append(half)
                elif self.leaf(tested[1]) == self.leaf(half[0]):
                    culprits.append(half[0])
                else:
                    # Paired across leaves: the node or its leaf's uplinks; do not guess.
                    unresolved.append(half[0])
            for parent in {parent for parent, _, _ in plan}:
                passes = outcome[parent]
                if len(passes) == 2 and all(passes):
                    findings.extend(self._between(parent))
        if not (culprits or findings or unresolved):
            findings.append(
                FabricFinding(
                    "nccl-unresolved",
                    hostlist.collect_hostlist(list(group)),
                    "the group underperformed but no subgroup did (noise or a scale effect)",
                )
            )
        blamed = set(culprits) | set(unresolved)
        cleared = tuple(n for n in group if n not in blamed)
        return Localization(
            tuple(dict.fromkeys(culprits)),
            tuple(findings),
            tuple(self.runs),
            cleared,
            tuple(dict.fromkeys(unresolved)),
        )

    def _plan_round(
        self, failing: Sequence[Group], pending: Sequence[tuple[Group, str]]
    ) -> tuple[list[tuple[Group, Group, Group]], list[tuple[Group, str]]]:
        """Both halves of every failing group, and single suspects each with a partner.

        Returns ``(parent, half, group to test)`` triples and the singles still waiting for a
        known-good partner (one may appear once this round's passing halves are known).
        """
        plan: list[tuple[Group, Group, Group]] = []
        busy: set[str] = set()
        singles = list(pending)
        for g in failing:
            for h in self.split(g):
                if len(h) >= 2:
                    plan.append((g, h, h))
                    busy |= set(h)
                elif len(h) == 1:
                    singles.append((g, h[0]))
        suspects = {s for _, s in singles}
        deferred: list[tuple[Group, str]] = []
        for parent, s in singles:
            p = self.partner(s, busy | suspects)
            if p is None:
                deferred.append((parent, s))
                continue
            plan.append((parent, (s,), (s, p)))
            busy |= {s, p}
        return plan, deferred

    def _between(self, parent: Group) -> list[FabricFinding]:
        """``parent`` failed but both halves passed: blame the path between them."""
        a, b = self.split(parent)
        leaves_a = sorted({self.leaf(n) for n in a})
        leaves_b = sorted({self.leaf(n) for n in b})
        if leaves_a == leaves_b:
            return [
                FabricFinding(
                    "nccl-unresolved",
                    hostlist.collect_hostlist(list(parent)),
                    "group underperforms although both halves pass (scale effect or noise); "
                    "rerun, then inspect NCCL_DEBUG=INFO output",
                )
            ]
        inside = set(leaves_a) | set(leaves_b)
        refs = [n for n in sorted(self.good) if self.leaf(n) not in inside]
        blamed: list[str] = []
        tests: list[Group] = []
        sides: list[str] = []
        busy: set[str] = set()
        for leaves, side in ((leaves_a, a), (leaves_b, b)):
            if len(leaves) != 1:
                continue
            ref = next((r for r in refs if r not in busy), None)
            if ref is None:
                break
            rep = side[0]
            tests.append((rep, ref))
            sides.append(leaves[0])
            busy |= {rep, ref}
        if tests and len(tests) == sum(len(x) == 1 for x in (leaves_a, leaves_b)):
            for leaf, run in zip(sides, self.test_round(tests, "uplink"), strict=True):
                if not run.passed:
                    blamed.append(leaf)
        evidence = "\n".join(
            f"{r.label} {hostlist.collect_hostlist(list(r.nodes))}: {r.busbw_gbs:.1f} GB/s "
            f"(floor {r.floor_gbs:.1f})"
            for r in self.runs
            if set(r.nodes) <= set(parent)
            or (set(r.nodes) & set(parent) and r.label.endswith("uplink"))
        )
        if blamed:
            return [
                FabricFinding(
                    "leaf-uplink",
                    leaf,
                    f"cross-leaf collectives{self._on_rail()} through leaf group {leaf} "
                    "underperform while intra-leaf ones pass: check that leaf's uplinks "
                    "(iblinkinfo, port counters)",
                    evidence,
                )
                for leaf in blamed
            ]
        return [
            FabricFinding(
                "leaf-path",
                f"{'+'.join(leaves_a)} <-> {'+'.join(leaves_b)}",
                f"collectives{self._on_rail()} between these leaf groups underperform while each "
                "side passes alone",
                evidence,
            )
        ]

    def _on_rail(self) -> str:
        return "" if self.rail is None else f" on rail {self.rail}"


def run_bound(culprits: int, nodes: int) -> int:
    """The run budget the localization promises: ``1 + 2 k ceil(log2 n) + 4``."""
    k = max(culprits, 1)
    return 1 + 2 * k * max(math.ceil(math.log2(max(nodes, 2))), 1) + 4


def localization_results(
    loc: Localization, *, check: str, level: Level = Level.FULL, floor_gbs: float
) -> list[CheckResult]:
    """Per-node results of one localization: culprits fail, unresolved hold, the rest pass."""
    out: list[CheckResult] = []

    def evidence(node: str) -> str:
        return "\n".join(
            f"{r.label} {','.join(r.nodes)}: {r.busbw_gbs:.1f} GB/s (floor {r.floor_gbs:.1f})"
            for r in loc.runs
            if node in r.nodes
        )

    for node in loc.culprits:
        mine = [r for r in loc.runs if node in r.nodes and len(r.nodes) <= 2]
        last = mine[-1] if mine else None
        out.append(
            CheckResult(
                node=node,
                check=check,
                status=Status.FAIL,
                measured=round(last.busbw_gbs, 2) if last else None,
                expected=f">= {floor_gbs:.1f} GB/s",
                evidence=evidence(node),
                level=level,
                message="localized: underperforms when paired with a known-good node",
            )
        )
    for node in loc.unresolved:
        out.append(
            CheckResult(
                node=node,
                check=check,
                status=Status.ERROR,
                expected=f">= {floor_gbs:.1f} GB/s",
                evidence=evidence(node),
                level=level,
                message="in a failing group but no known-good partner was available",
            )
        )
    for node in loc.cleared:
        # measured: the largest passing run that cleared it (the whole batch when all is well)
        passing = [r for r in loc.runs if node in r.nodes and r.passed]
        best = max(passing, key=lambda r: len(r.nodes)) if passing else None
        out.append(
            CheckResult(
                node=node,
                check=check,
                status=Status.PASS,
                measured=round(best.busbw_gbs, 2) if best else None,
                expected=f">= {floor_gbs:.1f} GB/s",
                evidence=evidence(node),
                level=level,
            )
        )
    return out
