"""``gpuforge-node conformance`` on a simulated node: passive checks + drift in one record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpuforge.node.__main__ import main
from gpuforge.node.record import from_dict
from tests.unit.node.simnode import SimNode


def _expected(directory: Path, conf: Path) -> None:
    (directory / "state").mkdir(parents=True)
    digest = "sha256:" + hashlib.sha256(conf.read_bytes()).hexdigest()
    (directory / "state" / "nccl.json").write_text(
        json.dumps({"schema": "gpuforge.expected/1", "role": "nccl", "files": {str(conf): digest}})
    )


def _run(
    node: SimNode,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, object]:
    node.config()
    for key, value in node.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GPUFORGE_NODE_PROC", str(node.proc))
    rc = main(
        ["conformance", "--level", "quick", "--config", str(node.root / "health.yaml"),
         "--expected-dir", str(tmp_path / "expected"), "--no-send"]
    )  # fmt: skip
    assert rc == 0
    record: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return record


def test_a_clean_node_conforms_and_an_edited_file_is_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    node = SimNode(tmp_path / "node")
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_IB_HCA=mlx5_0\n")
    _expected(tmp_path / "expected", conf)
    record = _run(node, tmp_path, monkeypatch, capsys)
    assert from_dict(record).tier == "conformance"
    assert record["verdict"] == "pass", [c for c in record["checks"] if c["status"] != "pass"]  # type: ignore[union-attr]
    state_before = (
        (node.root / "state" / "state.json").read_bytes()
        if (node.root / "state" / "state.json").exists()
        else None
    )

    conf.write_text("NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=INFO\n")
    record = _run(node, tmp_path, monkeypatch, capsys)
    assert record["verdict"] == "fail"
    assert [(d["kind"], d["item"]) for d in record["drift"]] == [("file", str(conf))]  # type: ignore[index,union-attr]
    drift_check = next(c for c in record["checks"] if c["check"] == "conformance.drift")  # type: ignore[index,union-attr]
    assert drift_check["action"] == "quarantine"
    # the health tier's streaks are not touched by a conformance task
    after = node.root / "state" / "state.json"
    assert (after.read_bytes() if after.exists() else None) == state_before
    last = json.loads((node.root / "state" / "last-conformance.json").read_text())
    assert last["verdict"] == "fail"
    assert (
        'gpuforge_conformance_drift_items{kind="file"} 1'
        in (node.root / "textfile" / "gpuforge_conformance.prom").read_text()
    )
