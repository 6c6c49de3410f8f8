"""A fake Slurm, an admission record and a history store for the controller-side health tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpuforge.admission import Admission, AdmissionRecord
from gpuforge.health.decide import Decider, DecisionPolicy
from gpuforge.history import HistoryStore
from gpuforge.slurm.control import SlurmClient

from ..history.records import T0
from ..slurm.fake import FakeSlurm

MakeDecider = Callable[..., tuple[Decider, FakeSlurm, HistoryStore]]


def fleet(count: int, per_leaf: int = 1) -> dict[str, str]:
    """``count`` nodes ``n0000``..., ``per_leaf`` of them under each rail-0 leaf."""
    return {f"n{i:04d}": f"leaf-{i // per_leaf:04d}-r0" for i in range(count)}


@pytest.fixture
def make_decider(tmp_path: Path) -> MakeDecider:
    def make(
        leaves: dict[str, str],
        policy: DecisionPolicy | None = None,
        drained: dict[str, str] | None = None,
    ) -> tuple[Decider, FakeSlurm, HistoryStore]:
        nodes = dict.fromkeys(leaves, ("IDLE", ""))
        for node, reason in (drained or {}).items():
            nodes[node] = ("IDLE+DRAIN", reason)
        slurm = FakeSlurm(nodes)
        store = HistoryStore.open(tmp_path / "lab" / "history.db")
        admission = Admission(
            SlurmClient(slurm, "ctl01"),
            AdmissionRecord(tmp_path / "lab" / "admission.db"),
            clock=lambda: T0,
        )
        decider = Decider(admission, policy=policy, leaves=leaves, store=store)
        return decider, slurm, store

    return make
