"""``gpuforge health history|serve`` and ``gpuforge fleet status`` through the CLI runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuforge.cli import fleet as fleet_cli
from gpuforge.cli import main
from gpuforge.generate import write_cluster_inventory
from gpuforge.history import HistoryStore, history_path
from gpuforge.slurm.control import SlurmClient
from gpuforge.topology import load_cluster

from ..conftest import LAB
from ..history.records import T0, record
from ..slurm.fake import FakeSlurm


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("c") / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    return root


@pytest.fixture
def state(tmp_path: Path) -> Path:
    xid = {"time": "2026-11-18T11:10:00Z", "gpu": 3, "event": "xid", "code": 79, "detail": "off"}
    with HistoryStore.open(history_path(tmp_path, "lab")) as store:
        for i in range(1, 7):  # gpu07 and gpu08 never report
            store.ingest([record(f"gpu{i:02d}", at=T0)], received=T0)
        store.ingest([record("gpu03", at=T0 + 300, verdict="fail",
                             failed=(("gpu.xid", "reboot"),), events=[xid])],
                     received=T0 + 300)  # fmt: skip
        store.add_event("gpu03", "drain", at=T0 + 301, check="gpu.xid", action="reboot",
                        source="health", detail="failed gpu.xid")  # fmt: skip
    return tmp_path


def test_history_lists_changes_and_events_newest_first(state: Path) -> None:
    result = run("health", "history", "gpu03", "--state-dir", state)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("gpu03 passive: fail at")
    kinds = [line.split()[1] for line in lines[1:]]
    assert kinds == ["drain", "passive", "failure", "xid", "passive"]
    assert "code=79 gpu=3" in result.output


def test_history_json_and_since(state: Path) -> None:
    result = run("health", "history", "gpu03", "--state-dir", state, "--json",
                 "--since", "2026-11-18T11:10:01Z")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["latest"]["passive"]["verdict"] == "fail"
    # --since is by arrival: the Xid the node dated 11:10:00 came with the failing record.
    assert [h["kind"] for h in data["history"]] == ["drain", "verdict", "failure", "xid"]
    assert [(h["at"], h["received"]) for h in data["history"]][-1] == (
        "2026-11-18T11:10:00Z",
        "2026-11-18T11:11:40Z",
    )


def test_history_of_an_unknown_node_is_bad_input(state: Path) -> None:
    result = run("health", "history", "gpu99", "--state-dir", state)
    assert result.exit_code == 2
    assert "no history for gpu99" in result.output


def test_a_corrupt_history_is_exit_2_and_left_alone(tmp_path: Path, cluster_dir: Path) -> None:
    path = history_path(tmp_path, "lab")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage" * 1000)
    for args in (
        ("health", "history", "gpu01", "--state-dir", tmp_path),
        ("health", "serve", "--inventory", cluster_dir, "--state-dir", tmp_path,
         "--listen", "127.0.0.1:0", "--metrics-dir", tmp_path / "m"),
        ("fleet", "status", "--inventory", cluster_dir, "--state-dir", tmp_path, "--no-slurm"),
    ):  # fmt: skip
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert str(path) in result.output and "Traceback" not in result.output
    assert path.read_bytes() == b"garbage" * 1000


def test_fleet_status_groups_nodes(
    state: Path, cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = FakeSlurm({f"gpu{i:02d}": ("IDLE", "") for i in range(1, 9)})
    slurm.nodes["gpu03"] = ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")
    slurm.nodes["gpu05"] = ("IDLE+DRAIN", "fan replaced, burn-in pending")
    monkeypatch.setattr(fleet_cli, "slurm_client", lambda *_: SlurmClient(slurm, "ctl01"))
    monkeypatch.setattr(fleet_cli.time, "time", lambda: T0 + 600)
    result = run("fleet", "status", "--inventory", cluster_dir, "--state-dir", state)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "verdict   pass 5  warn 0  fail 1  error 0  no record 2" in out
    assert "action    reboot     gpu03 (1)" in out
    assert "by gpuforge gpu03 (1)" in out
    assert "by operators gpu05 (1)" in out
    assert "stale     gpu[07-08] (2)" in out
    assert "gpu03" in out.splitlines()[-1] and "gpu.xid=fail:reboot" in out.splitlines()[-1]
    assert len([c for c in slurm.calls if c[:2] == ["scontrol", "--oneliner"]]) == 1
    result = run("fleet", "status", "--inventory", cluster_dir, "--state-dir", state, "--json")
    data = json.loads(result.output)
    assert data["counts"]["drained"] == {"gpuforge": 1, "operator": 1}
    assert data["counts"]["stale"] == 2


def _skewed_state(tmp_path: Path) -> Path:
    """Four nodes, the collector's clock at T0: gpu01 20 minutes behind and gpu02 4 minutes
    ahead (within the collector's 300 s), both sending; gpu03 behind, silent for 30 minutes, and
    gpu04 ahead, silent for 16 minutes."""
    with HistoryStore.open(history_path(tmp_path, "lab")) as store:
        store.ingest([record("gpu01", at=T0 - 60 - 1200)], received=T0 - 60)
        store.ingest([record("gpu02", at=T0 - 60 + 240)], received=T0 - 60)
        store.ingest([record("gpu03", at=T0 - 1800 - 1200)], received=T0 - 1800)
        store.ingest([record("gpu04", at=T0 - 960 + 240)], received=T0 - 960)
        store.ingest([record("gpu05", at=T0 - 60)], received=T0 - 60)
        store.ingest([record("gpu06", at=T0 - 60)], received=T0 - 60)
    return tmp_path


def test_fleet_status_measures_staleness_from_the_receive_time(
    tmp_path: Path, cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stale: nothing *received* for 3 intervals (900 s). A node 20 minutes behind that sends
    is not stale (its record's own date is 21 minutes old); one 4 minutes ahead that stopped 16
    minutes ago is (its record's date says 12 minutes)."""
    state = _skewed_state(tmp_path)
    monkeypatch.setattr(fleet_cli.time, "time", lambda: T0)
    result = run("fleet", "status", "--inventory", cluster_dir, "--state-dir", state,
                 "--no-slurm", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    nodes = {n["node"]: n for n in data["nodes"]}
    assert sorted(n for n, v in nodes.items() if v["stale"]) == [
        "gpu03", "gpu04", "gpu07", "gpu08"
    ]  # fmt: skip
    assert data["counts"]["stale"] == 4
    assert (nodes["gpu01"]["age_s"], nodes["gpu02"]["age_s"]) == (60, 60)
    # The node's time stays beside the collector's.
    assert (nodes["gpu01"]["at"], nodes["gpu01"]["received"]) == (
        "2026-11-18T10:45:40Z",
        "2026-11-18T11:05:40Z",
    )
    text = run("fleet", "status", "--inventory", cluster_dir, "--state-dir", state, "--no-slurm")
    assert "stale     gpu[03-04,07-08] (4) (no record received for 3 intervals" in text.output
    assert "age       newest 1m, median 1m, oldest 30m (gpu03)" in text.output


def test_history_is_in_the_order_received_with_the_nodes_time_beside(tmp_path: Path) -> None:
    """gpu01's clock is 20 minutes behind: its failure, the controller's drain (the
    controller's clock) and its recovery list in the order they happened at the collector,
    each record's own time beside its arrival."""
    with HistoryStore.open(history_path(tmp_path, "lab")) as store:
        store.ingest([record("gpu01", at=T0 - 1200, verdict="fail",
                             failed=(("gpu.xid", "reboot"),))], received=T0)  # fmt: skip
        store.add_event("gpu01", "drain", at=T0 + 1, check="gpu.xid", action="reboot",
                        source="health")  # fmt: skip
        store.ingest([record("gpu01", at=T0 + 300 - 1200)], received=T0 + 300)
    result = run("health", "history", "gpu01", "--state-dir", tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "gpu01 passive: pass at 2026-11-18T10:51:40Z (node's clock), received 2026-11-18T11:11:40Z"
    )
    assert [line.split()[:2] for line in lines[1:]] == [
        ["2026-11-18T11:11:40Z", "passive"],
        ["2026-11-18T11:06:41Z", "drain"],
        ["2026-11-18T11:06:40Z", "passive"],
        ["2026-11-18T11:06:40Z", "failure"],
    ]
    assert lines[1].endswith("[node's clock 2026-11-18T10:51:40Z]")
    assert "node's clock" not in lines[2]  # the controller's own event: one time


@pytest.mark.parametrize(("via", "remote"), [(None, False), ("local", False)])
def test_serve_decodes_credentials_here_for_via_local(
    cluster_dir: Path, tmp_path: Path, via: str | None, remote: bool
) -> None:
    """``--via local`` (the services unit's) means this machine's munged, as no --via does: not
    an SSH hop to a host named "local"."""
    from gpuforge.cli import health as health_cli  # noqa: PLC0415
    from gpuforge.cli.context import cluster_context  # noqa: PLC0415

    ctx = cluster_context(None, cluster_dir, tmp_path)
    auth = health_cli._authenticator(ctx, "required", 0, via, None)
    try:
        assert (auth.unmunge.runner is not None) is remote
    finally:
        auth.close()
