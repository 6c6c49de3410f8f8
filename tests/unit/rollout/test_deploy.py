from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.rollout.deploy import DeployRequest, deploy_phase
from gpuforge.rollout.gate import GateClosed
from gpuforge.rollout.state import NodeState, StateStore, open_store

from .fakes import FakeSteps

PHASE1 = tuple(f"gpu{i:02d}" for i in range(1, 5))
PHASE2 = tuple(f"gpu{i:02d}" for i in range(5, 9))


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return open_store(tmp_path / "lab.db")


def _deploy(store: StateStore, steps: FakeSteps, tmp_path: Path, **kw: object) -> object:
    phase = int(kw.pop("phase", 1))  # type: ignore[call-overload]
    hosts = PHASE1 if phase == 1 else PHASE2
    request = DeployRequest(phase=phase, hosts=hosts, gate_fraction=0.75, operator="t", **kw)  # type: ignore[arg-type]
    return deploy_phase(store, steps, request, lock_path=tmp_path / "lab.lock")


def test_healthy_phase_admits_every_node(store: StateStore, tmp_path: Path) -> None:
    steps = FakeSteps()
    outcome = _deploy(store, steps, tmp_path)
    assert outcome.passed  # type: ignore[attr-defined]
    assert {n.state for n in store.nodes(1)} == {NodeState.ADMITTED}
    assert steps.slurm == dict.fromkeys(PHASE1, "resumed")


def test_faulty_node_is_quarantined_with_the_failed_check(
    store: StateStore, tmp_path: Path
) -> None:
    steps = FakeSteps(faulty={"gpu02": "nvlink_links_up"})
    outcome = _deploy(store, steps, tmp_path)
    assert store.node("gpu02").state is NodeState.QUARANTINED
    assert store.node("gpu02").reason == "nvlink_links_up"
    assert steps.slurm["gpu02"] == "drained: nvlink_links_up"
    assert outcome.passed  # 3/4 admitted meets a 0.75 gate  # type: ignore[attr-defined]


def test_unreachable_node_is_left_out_not_fatal(store: StateStore, tmp_path: Path) -> None:
    steps = FakeSteps(unreachable={"gpu03"})
    _deploy(store, steps, tmp_path)
    assert store.node("gpu03").state is NodeState.UNREACHABLE
    assert ("provision", ("gpu01", "gpu02", "gpu04")) in steps.calls


def test_provision_failure_quarantines_and_skips_validation(
    store: StateStore, tmp_path: Path
) -> None:
    steps = FakeSteps(broken_provision={"gpu01"})
    _deploy(store, steps, tmp_path)
    assert store.node("gpu01").state is NodeState.QUARANTINED
    assert "no such version" in store.node("gpu01").reason
    assert ("validate", ("gpu02", "gpu03", "gpu04")) in steps.calls


def test_gate_blocks_next_phase_and_names_what_failed(store: StateStore, tmp_path: Path) -> None:
    _deploy(store, FakeSteps(faulty={"gpu01": "ecc", "gpu02": "xid"}), tmp_path)
    with pytest.raises(
        GateClosed, match=r"phase 1 failed its gate: 2/4 admitted.*gpu01 \(quarantined: ecc\)"
    ):
        _deploy(store, FakeSteps(), tmp_path, phase=2)


def test_phase_two_needs_phase_one_to_have_run(store: StateStore, tmp_path: Path) -> None:
    with pytest.raises(GateClosed, match="phase 1 has not run yet"):
        _deploy(store, FakeSteps(), tmp_path, phase=2)


def test_force_overrides_the_gate_and_records_the_reason(store: StateStore, tmp_path: Path) -> None:
    outcome = _deploy(store, FakeSteps(), tmp_path, phase=2, force_reason="vendor swap window")
    assert any("overridden" in n for n in outcome.notes)  # type: ignore[attr-defined]
    [override] = store.overrides()
    assert "vendor swap window" in override["reason"]


def test_rerun_does_not_reprovision_admitted_nodes(store: StateStore, tmp_path: Path) -> None:
    _deploy(store, FakeSteps(faulty={"gpu04": "gpu_count"}), tmp_path)
    again = FakeSteps()
    _deploy(store, again, tmp_path)
    assert again.calls[1] == ("provision", ("gpu04",))
    assert store.node("gpu04").state is NodeState.ADMITTED


def test_redo_reprovisions_everything(store: StateStore, tmp_path: Path) -> None:
    _deploy(store, FakeSteps(), tmp_path)
    again = FakeSteps()
    _deploy(store, again, tmp_path, redo=True)
    assert again.calls[1] == ("provision", PHASE1)


def test_only_revalidates_a_repaired_node(store: StateStore, tmp_path: Path) -> None:
    _deploy(store, FakeSteps(faulty={"gpu02": "ecc"}), tmp_path)
    repaired = FakeSteps()
    _deploy(store, repaired, tmp_path, only=("gpu02",))
    assert repaired.calls[0] == ("preflight", ("gpu02",))
    assert store.node("gpu02").state is NodeState.ADMITTED
    history = [t[1] for t in store.transitions("gpu02")]
    assert history[-3:] == ["provisioned", "validating", "admitted"]


def test_interrupted_validation_resumes_without_reprovisioning(
    store: StateStore, tmp_path: Path
) -> None:
    store.register_nodes((h, 1) for h in PHASE1)
    store.transition(PHASE1, NodeState.PROVISIONING, "", None)
    store.transition(PHASE1, NodeState.PROVISIONED, "", None)
    store.transition(["gpu01"], NodeState.VALIDATING, "", None)
    steps = FakeSteps()
    _deploy(store, steps, tmp_path)
    assert [c for c in steps.calls if c[0] == "provision"] == []
    assert {n.state for n in store.nodes(1)} == {NodeState.ADMITTED}


def test_only_outside_the_phase_is_bad_input(store: StateStore, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="outside phase 1: gpu07"):
        _deploy(store, FakeSteps(), tmp_path, only=("gpu07",))


def test_controller_is_provisioned_with_the_batch(store: StateStore, tmp_path: Path) -> None:
    steps = FakeSteps()
    request = DeployRequest(
        phase=1, hosts=PHASE1, gate_fraction=1.0, infra=("ctl01",), operator="t"
    )
    deploy_phase(store, steps, request, lock_path=tmp_path / "lock")
    assert steps.calls[1] == ("provision", ("ctl01", *PHASE1))
    assert [n.hostname for n in store.nodes()] == list(PHASE1)  # infra is not a GPU node record


def test_unreachable_controller_stops_the_run(store: StateStore, tmp_path: Path) -> None:
    steps = FakeSteps(unreachable={"ctl01"})
    request = DeployRequest(
        phase=1, hosts=PHASE1, gate_fraction=1.0, infra=("ctl01",), operator="t"
    )
    with pytest.raises(Exception, match=r"infrastructure node.*ctl01: ssh: connection refused"):
        deploy_phase(store, steps, request, lock_path=tmp_path / "lock")
    assert store.runs()[-1].status == "aborted"
