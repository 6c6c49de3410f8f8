"""How well a ranking's scores mean what they say, on labelled telemetry.

Labelled telemetry is telemetry whose outcome is known: which nodes failed (a ``failure`` or
``rma`` event) within the horizon after the moment it was scored. :func:`evaluate` reports

* reliability per bin (:data:`BINS`): the nodes whose score fell in the bin, their mean score
  and the share that failed; a calibrated score has the two close, so that an operator's
  threshold of 0.5 means "about one in two of these fails within the horizon";
* precision and recall at ``k`` (``k`` = the number of failures unless given) and at a score
  threshold; the Brier score (mean squared error of the score as a probability).

The scorecard of past drains (:func:`gpuforge.predict.act.scorecard`) judges what gpuforge did;
this judges what it would have said, on every node.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuforge.predict.score import RiskReport
from gpuforge.predict.telemetry import Event

#: Reliability bins (lower edges inclusive; the last bin includes 1).
BINS = (0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Events that make a node a failure in labelled telemetry.
FAILED = ("failure", "rma")


@dataclass
class ReliabilityBin:
    """One score bin: how many nodes, their scores' sum, how many failed."""

    lo: float
    hi: float
    nodes: int = 0
    score_sum: float = 0.0
    failed: int = 0

    @property
    def mean_score(self) -> float | None:
        """The mean score of the bin's nodes (None when empty)."""
        return self.score_sum / self.nodes if self.nodes else None

    @property
    def observed(self) -> float | None:
        """The share of the bin's nodes that failed (None when empty)."""
        return self.failed / self.nodes if self.nodes else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        mean, seen = self.mean_score, self.observed
        return {
            "bin": [self.lo, self.hi],
            "nodes": self.nodes,
            "mean_score": None if mean is None else round(mean, 3),
            "observed": None if seen is None else round(seen, 3),
            "failed": self.failed,
        }


@dataclass
class Evaluation:
    """A ranking against what happened."""

    k: int
    hits_at_k: int
    failures: int
    threshold: float
    flagged: int
    hits_flagged: int
    decoys_at_k: int
    brier: float
    bins: list[ReliabilityBin] = field(default_factory=list)

    @property
    def precision_at_k(self) -> float:
        """Failures among the top ``k``, over ``k``."""
        return self.hits_at_k / self.k if self.k else 0.0

    @property
    def recall_at_k(self) -> float:
        """Failures among the top ``k``, over all failures."""
        return self.hits_at_k / self.failures if self.failures else 0.0

    @property
    def precision_flagged(self) -> float | None:
        """Failures among nodes scored >= threshold, over those nodes."""
        return self.hits_flagged / self.flagged if self.flagged else None

    @property
    def recall_flagged(self) -> float:
        """Failures among nodes scored >= threshold, over all failures."""
        return self.hits_flagged / self.failures if self.failures else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (in ``fleet risk --scorecard --json`` as ``calibration``)."""
        flagged = self.precision_flagged
        return {
            "k": self.k,
            "failures": self.failures,
            "precision_at_k": round(self.precision_at_k, 3),
            "recall_at_k": round(self.recall_at_k, 3),
            "decoys_at_k": self.decoys_at_k,
            "threshold": self.threshold,
            "flagged": self.flagged,
            "precision_flagged": None if flagged is None else round(flagged, 3),
            "recall_flagged": round(self.recall_flagged, 3),
            "brier": round(self.brier, 4),
            "reliability": [b.to_dict() for b in self.bins],
        }


def new_bins() -> list[ReliabilityBin]:
    """Empty reliability bins."""
    return [ReliabilityBin(lo, hi) for lo, hi in itertools.pairwise(BINS)]


def add_to_bins(bins: Sequence[ReliabilityBin], score: float, failed: bool) -> None:
    """Count one node in its bin."""
    for b in bins:
        if b.lo <= score < b.hi or (b.hi == BINS[-1] and score >= b.hi):
            b.nodes += 1
            b.score_sum += score
            b.failed += int(failed)
            return


def failed_after(events: Iterable[Event], at: float, horizon_s: float) -> set[str]:
    """Nodes with a failure or RMA in ``(at, at + horizon_s]``: the labels."""
    return {e.node for e in events if e.event in FAILED and at < e.time <= at + horizon_s}


def evaluate(
    report: RiskReport,
    failed: Collection[str],
    *,
    k: int | None = None,
    threshold: float = 0.5,
    decoys: Collection[str] = (),
) -> Evaluation:
    """``report``'s scored nodes against ``failed`` (nodes with too little data are left out)."""
    ranked = report.ranked
    failed_scored = {r.node for r in ranked} & set(failed)
    k = len(failed_scored) if k is None else k
    top = [r.node for r in ranked[:k]]
    flagged = [r.node for r in ranked if r.score >= threshold]
    bins = new_bins()
    brier = 0.0
    for r in ranked:
        hit = r.node in failed_scored
        add_to_bins(bins, r.score, hit)
        brier += (r.score - float(hit)) ** 2
    return Evaluation(
        k=k,
        hits_at_k=sum(n in failed_scored for n in top),
        failures=len(failed_scored),
        threshold=threshold,
        flagged=len(flagged),
        hits_flagged=sum(n in failed_scored for n in flagged),
        decoys_at_k=sum(n in decoys for n in top),
        brier=brier / len(ranked) if ranked else 0.0,
        bins=bins,
    )


def format_bins(bins: Sequence[ReliabilityBin]) -> list[str]:
    """One line per bin: ``[0.40, 0.60)  nodes 12  mean score 0.52  failed 0.58``."""
    lines = []
    for b in bins:
        mean, seen = b.mean_score, b.observed
        close = "]" if b.hi == BINS[-1] else ")"
        lines.append(
            f"[{b.lo:.2f}, {b.hi:.2f}{close}  nodes {b.nodes:>5}  mean score "
            + ("  -  " if mean is None else f"{mean:.2f}")
            + "  failed "
            + ("  -" if seen is None else f"{seen:.2f} ({b.failed})")
        )
    return lines
