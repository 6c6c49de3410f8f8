"""``gpuforge remediate`` and ``gpuforge rma`` through click; Slurm, Ansible, burn-in faked."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.cli import remediate as cli
from gpuforge.command import CommandResult
from gpuforge.execution import plays
from gpuforge.health import remediate as rem
from gpuforge.history import HistoryStore, history_path
from gpuforge.inventory.reader import ClusterView, InventoryDir
from gpuforge.playbook import HostStats, RunResult
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate import pipeline
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status

from ..slurm.fake import FakeSlurm

XID = "gpuforge:gpu.xid:reboot"


class _Node:
    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        return CommandResult(host, command, 127, "", "not found")


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm(
        {
            "gpu01": ("IDLE+DRAIN", XID),
            "gpu02": ("IDLE+DRAIN", "waiting for a PSU"),
            "gpu03": ("IDLE", ""),
        }
    )
    topology = {
        "name": "lab",
        "nodes": [{"hostname": f"gpu0{i}", "role": "gpu"} for i in (1, 2, 3)],
    }
    view = ClusterView(InventoryDir(tmp_path / "inv"), topology, {})
    deps = pipeline.ValidationDeps(
        runner=_Node(), run_suite=lambda *_: pytest.fail("no suite here")
    )
    wiring = pipeline.Wiring(view, deps, SlurmClient(fake, "ctl01"))
    monkeypatch.setattr(cli.pipeline, "wire", lambda *_a, **_k: wiring)
    calls: list[tuple[str, ...]] = []

    def act(*_a: object) -> rem.ActFn:
        def run(nodes: Sequence[str], action: str) -> Mapping[str, str]:
            calls.append((*nodes, action))
            return {}

        return run

    def validate(*_a: object) -> rem.ValidateFn:
        def run(nodes: Sequence[str], _partners: Sequence[str]) -> BatchSummary:
            results = [
                CheckResult(n, "burnin.dcgm_diag", Status.PASS, level=Level.BURNIN) for n in nodes
            ]
            return BatchSummary.build(nodes, results, level=Level.BURNIN)

        return run

    monkeypatch.setattr(rem, "ansible_act", act)
    monkeypatch.setattr(rem, "pipeline_validate", validate)
    fake.calls_act = calls  # type: ignore[attr-defined]
    return fake


def _invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main,
        [*args, "--inventory", str(tmp_path / "inv"), "--state-dir", str(tmp_path / "state")],
    )
    return result.exit_code, result.output


def test_nodes_or_pending_exactly_one(tmp_path: Path, slurm: FakeSlurm) -> None:
    for args in (["remediate"], ["remediate", "gpu01", "--pending"]):
        code, out = _invoke(tmp_path, *args)
        assert code == 2
        assert "NODES" in out and "--pending" in out
    assert slurm.calls == []


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path: Path, slurm: FakeSlurm) -> None:
    code, out = _invoke(tmp_path, "remediate", "--pending", "--dry-run", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["dry_run"] is True
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert by_node["gpu01"]["result"] == "planned"
    assert by_node["gpu02"]["result"] == "skipped"
    assert slurm.updates() == []
    assert slurm.calls_act == []  # type: ignore[attr-defined]
    assert not (tmp_path / "state").exists()  # not even an empty record or history


def test_pending_remediates_and_resumes(tmp_path: Path, slurm: FakeSlurm) -> None:
    code, out = _invoke(tmp_path, "remediate", "--pending", "--json")
    assert code == 0, out
    by_node = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert by_node["gpu01"]["result"] == "resumed"
    assert slurm.nodes["gpu01"] == ("IDLE", "")
    assert slurm.nodes["gpu02"] == ("IDLE+DRAIN", "waiting for a PSU")
    assert slurm.calls_act == [("gpu01", "reboot")]  # type: ignore[attr-defined]
    with HistoryStore.open(history_path(tmp_path / "state", "lab")) as store:
        steps = [(e.data or {}).get("step") for e in store.events(node="gpu01")]
    assert steps == ["start", "acted", "concluded"]


def test_rma_bundle_out_and_back(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.nodes["gpu01"] = ("IDLE+DRAIN", "gpuforge:gpu.xid:rma")
    code, out = _invoke(tmp_path, "rma", "bundle", "gpu01", "--out", str(tmp_path / "b"), "--json")
    assert code == 0, out
    doc = json.loads(out)
    with tarfile.open(doc["archive"]) as tar:
        assert any(m.name.endswith("/manifest.json") for m in tar.getmembers())
    assert doc["errors"]  # the fake node has no tools: noted, bundle written anyway
    code, out = _invoke(tmp_path, "rma", "out", "gpu01", "--ticket", "T-1")
    assert code == 0, out
    code, out = _invoke(tmp_path, "rma", "back", "gpu01")
    assert code == 0, out
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:join:validate")
    code, out = _invoke(tmp_path, "rma", "back", "gpu01")
    assert code == 1
    assert "no RMA recorded out" in out


def test_cluster_or_inventory(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = _invoke(tmp_path, "remediate", "--pending", "--cluster", "lab")
    assert code == 2
    assert "not both" in out
    monkeypatch.chdir(tmp_path)  # inventory/lab and state/ are relative to the working directory
    result = CliRunner().invoke(main, ["remediate", "--pending", "--dry-run", "--cluster", "lab"])
    assert result.exit_code == 0, result.output  # inventory/lab, wired by the fake
    assert slurm.updates() == []
    assert not (tmp_path / "state").exists()


def test_act_maps_the_play_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_play(playbook: str, inventory: object, **kw: object) -> RunResult:
        seen.update(kw, playbook=playbook)
        return RunResult(
            status="failed",
            rc=2,
            hosts={"gpu01": HostStats(ok=3), "gpu02": HostStats(failures=1)},
            failed={"gpu02": "Reset the GPUs: GPU is lost"},
            unreachable={},
            artifact_dir=tmp_path,
            strategy="linear",
        )

    monkeypatch.setattr(plays, "run_playbook", fake_play)
    monkeypatch.setattr(plays, "plan_for", lambda _inventory: None)  # no execution hosts
    monkeypatch.setattr(plays.InventoryDir, "open", lambda p: InventoryDir(Path(p)))
    act = rem.ansible_act(tmp_path / "inv", tmp_path / "run", tmp_path / "play.json")
    errors = act(["gpu01", "gpu02", "gpu03"], "reset_gpu")
    assert errors == {
        "gpu02": "Reset the GPUs: GPU is lost",
        "gpu03": "the play never reached it (failed, rc 2)",
    }
    assert seen["playbook"] == "remediate.yml"
    assert seen["limit"] == "gpu01,gpu02,gpu03"
    assert seen["extravars"] == {"remediate_action": "reset_gpu"}
    assert seen["play_record"] == tmp_path / "play.json"
