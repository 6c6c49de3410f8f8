"""Verdict inputs that need the whole batch: peer comparison, and results for checks not run.

The rules that turn one node's results into a verdict live in :mod:`gpuforge.validate.result`
(:func:`~gpuforge.validate.result.decide`); what a verdict does in Slurm is
:mod:`gpuforge.admission`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuforge.validate.result import CheckResult, Level, Status
from gpuforge.validate.thresholds import PEER_FAIL_Z, PEER_MIN, PEER_WARN_Z, peer_scores


def peer_results(
    check: str,
    values: Mapping[str, float],
    *,
    unit: str,
    level: Level = Level.BURNIN,
    reference: Mapping[str, float] | None = None,
    floor: str = "",
) -> list[CheckResult]:
    """One ``<check>.peer`` result per node of ``values``: how far below the median it sits.

    ``reference`` adds already-admitted nodes to the pool (not scored). When the pool is too
    small for a meaningful median, every node gets a ``skip`` result that says so (and names
    ``floor``, what the node was judged against instead), never a silent pass.
    """
    out: list[CheckResult] = []
    scores = peer_scores(values, reference)
    if not scores:
        pool = len({**(reference or {}), **values})
        why = f"no peer comparison ({pool} node{'s' if pool != 1 else ''}, {PEER_MIN} needed)"
        if floor:
            why += f"; judged against {floor} only"
        return [
            CheckResult(
                node=node,
                check=f"{check}.peer",
                status=Status.SKIP,
                measured=round(value, 2),
                expected=f"{PEER_MIN} or more identical nodes",
                level=level,
                message=why,
            )
            for node, value in values.items()
        ]
    admitted = f", {len(reference)} admitted nodes among them" if reference else ""
    for node, s in scores.items():
        out.append(
            CheckResult(
                node=node,
                check=f"{check}.peer",
                status=s.status,
                measured=round(s.value, 2),
                expected=(
                    f"within peers: median {s.median:.1f} {unit}{admitted}; warn at "
                    f"z <= -{PEER_WARN_Z}, fail at z <= -{PEER_FAIL_Z} (modified z, MAD)"
                ),
                evidence=f"modified z={s.z:+.2f}, {s.deficit * 100:.1f}% below the median",
                level=level,
                message="" if s.status is Status.PASS else "low outlier among identical peers",
            )
        )
    return out


def merge(*groups: Iterable[CheckResult]) -> list[CheckResult]:
    """Concatenate result lists (kept as a function so callers read as a pipeline)."""
    return [r for g in groups for r in g]


def not_run(
    nodes: Sequence[str], check: str, why: str, level: Level = Level.QUICK
) -> list[CheckResult]:
    """``error`` results for nodes a level could not reach: they hold, they are never drained."""
    return [
        CheckResult(node=n, check=check, status=Status.ERROR, message=why, level=level)
        for n in nodes
    ]
