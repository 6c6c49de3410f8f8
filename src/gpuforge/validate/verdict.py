"""From results to actions: peer comparison inside a batch, and Slurm drain/resume.

The rules that turn one node's results into a verdict live in :mod:`gpuforge.validate.result`
(:func:`~gpuforge.validate.result.decide`); this module adds what needs the whole batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuforge.errors import GpuforgeError
from gpuforge.slurm import control
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate.result import BatchSummary, CheckResult, Status, Tier, Verdict
from gpuforge.validate.thresholds import PEER_FAIL_Z, PEER_MIN, PEER_WARN_Z, peer_scores

#: Reasons we set start with this; only nodes drained with such a reason (or none) are resumed.
REASON_PREFIX = "gpuforge"


def peer_results(
    check: str,
    values: Mapping[str, float],
    *,
    unit: str,
    tier: Tier = Tier.BURNIN,
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
                tier=tier,
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
                tier=tier,
                message="" if s.status is Status.PASS else "low outlier among identical peers",
            )
        )
    return out


@dataclass(frozen=True)
class SlurmAction:
    """What the validation did (or deliberately did not do) to a node in Slurm."""

    node: str
    action: str  # drain | resume | none
    changed: bool
    detail: str

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "node": self.node,
            "action": self.action,
            "changed": self.changed,
            "detail": self.detail,
        }


def ours(reason: str) -> bool:
    """A drain reason gpuforge set (or no reason at all), which a pass may therefore clear."""
    return not reason.strip() or reason.strip().lower().startswith(REASON_PREFIX)


def apply_verdicts(summary: BatchSummary, client: SlurmClient) -> list[SlurmAction]:
    """Drain quarantined nodes, resume admitted ones that we had drained, leave held ones alone.

    A node drained by someone else (a reason not starting with ``gpuforge``) is never resumed:
    an operator's ``RMA ticket`` outranks a passing validation.
    """
    actions: list[SlurmAction] = []
    names = [n.node for n in summary.nodes]
    if not names:
        return actions
    try:
        states = {s.name: s for s in control.node_states(client, names)}
    except GpuforgeError as exc:
        return [SlurmAction(n, "none", False, f"slurm unavailable: {exc}") for n in names]
    for nv in summary.nodes:
        state = states.get(nv.node)
        if state is None:
            actions.append(SlurmAction(nv.node, "none", False, "unknown to Slurm"))
            continue
        if nv.verdict is Verdict.QUARANTINE:
            changes = control.drain(client, [nv.node], nv.drain_reason)
            actions.append(
                SlurmAction(nv.node, "drain", any(c.changed for c in changes), nv.drain_reason)
            )
        elif nv.verdict is Verdict.HOLD:
            actions.append(
                SlurmAction(
                    nv.node,
                    "none",
                    False,
                    "inconclusive (" + ",".join(nv.reasons) + "): neither drained nor resumed",
                )
            )
        elif state.resumable and ours(state.reason):
            changes = control.resume(client, [nv.node], f"{REASON_PREFIX}: validation passed")
            actions.append(
                SlurmAction(nv.node, "resume", any(c.changed for c in changes), "passed")
            )
        elif state.resumable:
            actions.append(
                SlurmAction(
                    nv.node, "none", False, f"passed, but drained by someone else: {state.reason}"
                )
            )
        else:
            actions.append(SlurmAction(nv.node, "none", False, f"passed; {state.state_text}"))
    return actions


def merge(*groups: Iterable[CheckResult]) -> list[CheckResult]:
    """Concatenate result lists (kept as a function so callers read as a pipeline)."""
    return [r for g in groups for r in g]


def not_run(
    nodes: Sequence[str], check: str, why: str, tier: Tier = Tier.QUICK
) -> list[CheckResult]:
    """``error`` results for nodes a tier could not reach: they hold, they are never drained."""
    return [
        CheckResult(node=n, check=check, status=Status.ERROR, message=why, tier=tier) for n in nodes
    ]
