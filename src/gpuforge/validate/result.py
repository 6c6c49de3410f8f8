"""The result model every check produces, and the verdict rules built on it.

A :class:`CheckResult` is one fact about one node (``node`` x ``check``), with the measured value,
the expectation and a bounded excerpt of the raw output. :func:`decide` turns a node's results into
a :class:`NodeVerdict`; :class:`BatchSummary` holds a whole validation run and its exit code. The
acceptance levels, the node checker's tiers and nightly conformance all produce it (the health
record, :mod:`gpuforge.node.record`, carries it from the node to the collector).

Verdict rules (see docs/validation.md):

* any ``fail`` -> ``quarantine`` (drained, reasons = the failed check names);
* otherwise any ``error`` (the check could not conclude: timeout, tool missing, unparsable output)
  -> ``hold``: not admitted, never drained on that evidence alone, and reported;
* otherwise ``admit`` (``warn`` results are listed but do not block).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuforge.validate.xid_catalogue import Action

#: Catalogue actions that take a node out of service, i.e. that a drain reason may carry.
DRAIN_ACTIONS = frozenset(a.value for a in Action if a.drains)

SCHEMA_VERSION = 1
EVIDENCE_MAX = 2000
_ELISION = "\n[... {n} characters elided ...]\n"

Measured = str | int | float | bool | None


class Status(enum.StrEnum):
    """Outcome of one check."""

    PASS = "pass"  # noqa: S105 - a status, not a password
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"


class Verdict(enum.StrEnum):
    """What to do with a node."""

    ADMIT = "admit"
    QUARANTINE = "quarantine"
    HOLD = "hold"


class Level(enum.StrEnum):
    """Validation levels, each including the previous one."""

    QUICK = "quick"
    BURNIN = "burnin"
    FULL = "full"


def bound_evidence(text: str, limit: int = EVIDENCE_MAX) -> str:
    """Keep ``text`` under ``limit`` characters: its head and its tail, with the elision marked.

    The tail is usually where a tool prints its verdict, the head where it prints what it ran on.
    """
    if len(text) <= limit:
        return text
    marker = _ELISION.format(n=len(text) - limit)
    keep = max(limit - len(marker), 0)
    head = keep // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]


def excerpt(
    text: str,
    needles: Iterable[str],
    limit: int = EVIDENCE_MAX,
    *,
    before: int = 8,
    after: int = 2,
) -> str:
    """Cut ``text`` to ``limit`` characters around the lines that explain a result.

    A tool's explanation (DCGM's "running at PCI link generation 3") sits in the middle of its
    output, where :func:`bound_evidence`'s head-and-tail cut drops it. Here every line containing
    one of ``needles`` is kept with ``before``/``after`` lines of context, plus the first and the
    last lines; the rest is elided with the number of lines marked. The context shrinks until the
    excerpt fits; if even the bare lines do not fit, they are cut at ``limit``.
    """
    wanted = [n for n in needles if n]
    if len(text) <= limit or not wanted:
        return bound_evidence(text, limit)
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if any(n in line for n in wanted)]
    if not hits:
        return bound_evidence(text, limit)
    for b, a, edge in ((before, after, 3), (before // 2, after, 2), (1, 1, 1), (0, 0, 1)):
        keep = set(range(edge)) | set(range(max(len(lines) - edge, 0), len(lines)))
        for i in hits:
            keep |= set(range(max(i - b, 0), min(i + a + 1, len(lines))))
        out = _join_kept(lines, sorted(keep))
        if len(out) <= limit:
            return out
    return bound_evidence(_join_kept(lines, hits), limit)


def _join_kept(lines: list[str], keep: list[int]) -> str:
    out: list[str] = []
    last = -1
    for i in keep:
        if i > last + 1:
            out.append(f"[... {i - last - 1} lines elided ...]")
        out.append(lines[i])
        last = i
    if last < len(lines) - 1:
        out.append(f"[... {len(lines) - 1 - last} lines elided ...]")
    return "\n".join(out)


@dataclass(frozen=True)
class CheckResult:
    """One fact about one node: what was measured, what was expected, and the raw evidence.

    The one result type of every path: the acceptance levels, the node checker's tiers and
    nightly conformance. The node checker builds its results with ``node=""`` (the health
    record, :class:`gpuforge.node.record.Record`, names its node once and fills it in).
    """

    node: str
    check: str
    status: Status
    measured: Measured = None
    expected: Measured = None
    evidence: str = ""
    duration_s: float = 0.0
    level: Level = Level.QUICK
    message: str = ""
    #: The catalogue action the result calls for (``reboot`` on a ``fail``, ``monitor`` on a
    #: ``warn``; docs/health.md); empty: none named (a failure then means ``quarantine``).
    action: str = ""
    #: The node tiers' shadow mode: reported, never counted in a verdict or a drain.
    shadow: bool = False
    #: Consecutive runs with this status (the node checker's hysteresis counter; 1 elsewhere).
    streak: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "level", Level(self.level))
        object.__setattr__(self, "evidence", bound_evidence(self.evidence))
        object.__setattr__(self, "duration_s", round(float(self.duration_s), 3))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``SCHEMA_VERSION``)."""
        return {
            "node": self.node,
            "check": self.check,
            "status": self.status.value,
            "measured": self.measured,
            "expected": self.expected,
            "evidence": self.evidence,
            "duration_s": self.duration_s,
            "tier": self.level.value,
            "message": self.message,
            **({"action": self.action} if self.action else {}),
            **({"shadow": True} if self.shadow else {}),
            **({"streak": self.streak} if self.streak != 1 else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckResult:
        """Inverse of :meth:`to_dict`; unknown keys are rejected by the constructor.

        The JSON key ``tier`` (kept for readers of the schema) holds the :class:`Level`.
        """
        fields = dict(data)
        if "tier" in fields:
            fields["level"] = fields.pop("tier")
        return cls(**fields)


@dataclass(frozen=True)
class NodeVerdict:
    """The decision for one node, with the check names that drove it."""

    node: str
    verdict: Verdict
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    results: tuple[CheckResult, ...] = ()

    @property
    def action(self) -> str:
        """The strongest drain action its failed checks call for; empty when none names one.

        Admission writes it into the drain reason (``gpuforge:<check>:<action>``); without one
        a failed node is drained for ``quarantine``.
        """
        named = [
            Action(r.action)
            for r in self.results
            if r.status is Status.FAIL and r.action in DRAIN_ACTIONS
        ]
        return max(named, key=lambda a: a.rank).value if named else ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``SCHEMA_VERSION``)."""
        return {
            "node": self.node,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "results": [r.to_dict() for r in self.results],
        }


@dataclass(frozen=True)
class FabricFinding:
    """A fault that belongs to the fabric rather than to a node (e.g. a slow leaf uplink)."""

    kind: str
    subject: str
    detail: str
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "kind": self.kind,
            "subject": self.subject,
            "detail": self.detail,
            "evidence": bound_evidence(self.evidence),
        }


def decide(node: str, results: Iterable[CheckResult]) -> NodeVerdict:
    """Apply the verdict rules to one node's results (module docstring)."""
    mine = tuple(r for r in results if r.node == node)
    failed = _unique(r.check for r in mine if r.status is Status.FAIL)
    errors = _unique(r.check for r in mine if r.status is Status.ERROR)
    warned = _unique(r.check for r in mine if r.status is Status.WARN)
    concluded = [r for r in mine if r.status is not Status.SKIP]
    if failed:
        return NodeVerdict(node, Verdict.QUARANTINE, failed, warned, mine)
    if errors:
        return NodeVerdict(node, Verdict.HOLD, errors, warned, mine)
    if not concluded:
        return NodeVerdict(node, Verdict.HOLD, ("no-results",), warned, mine)
    return NodeVerdict(node, Verdict.ADMIT, (), warned, mine)


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class BatchSummary:
    """A whole validation run: every node's verdict, fabric findings and run metadata."""

    nodes: tuple[NodeVerdict, ...]
    level: Level = Level.QUICK
    findings: tuple[FabricFinding, ...] = ()
    started_at: str = ""
    finished_at: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    fatal: str = ""

    @classmethod
    def build(
        cls,
        hosts: Iterable[str],
        results: Iterable[CheckResult],
        **kwargs: Any,
    ) -> BatchSummary:
        """Decide every host in ``hosts`` (a host with no result is held, never admitted)."""
        results = tuple(results)
        names = list(dict.fromkeys([*hosts, *(r.node for r in results)]))
        return cls(nodes=tuple(decide(n, results) for n in names), **kwargs)

    def by_verdict(self, verdict: Verdict) -> tuple[NodeVerdict, ...]:
        """Nodes with the given verdict, in batch order."""
        return tuple(n for n in self.nodes if n.verdict is verdict)

    @property
    def results(self) -> tuple[CheckResult, ...]:
        """Every check result of every node."""
        return tuple(r for n in self.nodes for r in n.results)

    @property
    def exit_code(self) -> int:
        """0 every node admitted; 1 a node failed or the fabric has a finding; 2 nothing concluded.

        A run that could not run at all (``fatal``) or that left nodes on hold without any
        failure exits 2: the operator has to act, but no node is known bad.
        """
        if self.fatal:
            return 2
        if self.by_verdict(Verdict.QUARANTINE) or self.findings:
            return 1
        if self.by_verdict(Verdict.HOLD):
            return 2
        return 0

    def notes(self) -> list[dict[str, str]]:
        """Passing checks that carry a message, one per check and message with its nodes.

        A pass with a message is something the operator should know without acting on it (e.g.
        "/proc/sys is read-only here: the boot-time values were checked"); eight nodes saying
        the same thing make one note.
        """
        grouped: dict[tuple[str, str], list[str]] = {}
        for r in self.results:
            if r.status is Status.PASS and r.message:
                grouped.setdefault((r.check, r.message), []).append(r.node)
        return [
            {"check": check, "nodes": _collect(nodes), "message": message}
            for (check, message), nodes in grouped.items()
        ]

    def counts(self) -> dict[str, int]:
        """Number of nodes per verdict (every verdict present, zero included)."""
        return {v.value: len(self.by_verdict(v)) for v in Verdict}

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON document (docs/validation.md, "JSON report")."""
        return {
            "schema_version": SCHEMA_VERSION,
            "tier": self.level.value,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "fatal": self.fatal,
            "counts": self.counts(),
            "meta": dict(self.meta),
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes(),
            "nodes": [n.to_dict() for n in self.nodes],
        }


def _collect(nodes: list[str]) -> str:
    # Imported here: the node checker (gpuforge.node) imports this module and python-hostlist is
    # not installed on nodes.
    import hostlist  # noqa: PLC0415

    return str(hostlist.collect_hostlist(nodes))
