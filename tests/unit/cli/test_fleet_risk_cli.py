"""``gpuforge fleet risk`` and ``export-telemetry`` through click: sources, errors, exit codes."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gpuforge.admission import Admission, AdmissionRecord, record_path
from gpuforge.cli import fleet_risk, main
from gpuforge.generate import write_cluster_inventory
from gpuforge.history import history_path
from gpuforge.history.store import HistoryStore
from gpuforge.predict.act import predicted_reason
from gpuforge.predict.score import ECC_SBE, REMAP_CORRECTABLE
from gpuforge.predict.telemetry import Event, SeriesKey, format_time, write_telemetry
from gpuforge.slurm.control import SlurmClient
from gpuforge.topology import load_cluster
from gpuforge.validate.result import NodeVerdict, Verdict
from tests.unit.conftest import LAB
from tests.unit.history.records import T0, record
from tests.unit.predict.builders import AT, fleet, ramp_from, set_series, times
from tests.unit.slurm.fake import FakeSlurm


def _telemetry_file(tmp_path: Path) -> Path:
    telemetry = fleet(nodes=8)
    set_series(telemetry, SeriesKey("gpu07", ECC_SBE, gpu=3), ramp_from(day=3, per_hour_end=400))
    rows = np.floor(np.linspace(0, 9, len(times())))
    set_series(telemetry, SeriesKey("gpu07", REMAP_CORRECTABLE, gpu=3), rows)
    out = io.StringIO()
    write_telemetry(telemetry, out)
    path = tmp_path / "fleet.jsonl"
    path.write_text(out.getvalue())
    return path


def test_risk_ranks_the_degrading_node_first(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    result = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "8 nodes scored, 1 with findings, 0 with too little data" in lines[0]
    assert lines[1].split()[:2] == ["1", "gpu07"]
    assert any("ecc_sbe_rate" in line and "gpu3" in line for line in lines)


def test_risk_json_lists_every_node(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    result = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "gpuforge.risk/1"
    assert data["nodes"][0]["node"] == "gpu07"
    assert len(data["nodes"]) == 8 and data["skipped_lines"] == 0


def test_malformed_line_exits_2_naming_the_line_or_is_skipped_and_counted(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(4, '{"time": "2026-11-30T19:20:00Z", "node": "gpu01", "value": 1}')
    path.write_text("\n".join(lines) + "\n")
    refused = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path)])
    assert refused.exit_code == 2
    assert f"{path}:5: " in refused.output and "missing" in refused.output
    assert "Traceback" not in refused.output
    skipped = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--on-error", "skip"]
    )
    assert skipped.exit_code == 0, skipped.output
    assert "1 malformed lines skipped" in skipped.output
    assert f"warning: {path}: line 5: " in skipped.output


def test_exactly_one_source_and_valid_durations(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    both = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--prometheus", "http://x"]
    )
    assert both.exit_code == 2 and "exactly one of" in both.output
    bad = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path), "--window", "7w"])
    assert bad.exit_code == 2 and "--window: '7w' is not a duration" in bad.output


def test_at_moves_the_window_back(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    early = "2026-11-19T12:00:00Z"  # before the degradation began: too little data everywhere
    result = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path), "--at", early])
    assert result.exit_code == 0, result.output
    assert "0 nodes scored" in result.output and "8 with too little data" in result.output


def test_scorecard_from_a_telemetry_file(tmp_path: Path) -> None:
    telemetry = fleet(nodes=2)
    telemetry.events += [
        Event(AT - 5 * 86400, "gpu01", "drain", detail=predicted_reason("ecc_sbe_rate")),
        Event(AT - 4 * 86400, "gpu01", "failure"),
        Event(AT - 5 * 86400, "gpu02", "drain", detail=predicted_reason("thermal_drift")),
        Event(AT - 4 * 86400, "gpu02", "resume"),
    ]
    out = io.StringIO()
    write_telemetry(telemetry, out)
    path = tmp_path / "h.jsonl"
    path.write_text(out.getvalue())
    result = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--scorecard", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["counts"] == {"confirmed": 1, "false_alarm": 1, "pending": 0, "no_outcome": 0}
    assert data["precision"] == 0.5


def _small_store(tmp_path: Path) -> Path:
    """A state directory whose ``lab`` history store holds 3 ECC samples and one Xid."""
    state = tmp_path / "state"
    (state / "lab").mkdir(parents=True)
    with HistoryStore.open(state / "lab" / "history.db") as store:
        for hour in range(3):
            counters = {"gpu/0/ecc_sbe_volatile": hour * 10}
            store.ingest([record("gpu01", at=T0 + hour * 3600, counters=counters)])
        store.add_event("gpu01", "xid", at=T0 + 60, code=31, gpu=0)
    return state


def test_export_telemetry_from_the_store_reads_back(tmp_path: Path) -> None:
    state = _small_store(tmp_path)
    out = tmp_path / "export.jsonl"
    result = CliRunner().invoke(
        main,
        ["fleet", "export-telemetry", "--state-dir", str(state), "--since", "400d",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"schema": "gpuforge.telemetry/1"}
    assert sum('"metric":"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"' in line for line in lines) == 3
    assert sum('"event":"xid"' in line for line in lines) == 1
    risk = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(out), "--window", "3h"])
    assert risk.exit_code == 0, risk.output


def test_export_history_is_a_hidden_alias_of_export_telemetry(tmp_path: Path) -> None:
    """Scripts written before the rename keep working: the same options, the same file."""
    state = _small_store(tmp_path)
    written = {}
    for name in ("export-telemetry", "export-history"):
        out = tmp_path / f"{name}.jsonl"
        args = ["fleet", name, "--state-dir", str(state), "--since", "400d", "--out", str(out)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "exported 5 lines: 1 series, 1 events" in result.output
        written[name] = out.read_text()
    assert written["export-history"] == written["export-telemetry"]
    listing = CliRunner().invoke(main, ["fleet", "--help"]).output
    assert "export-telemetry" in listing and "export-history" not in listing
    bad = CliRunner().invoke(main, ["fleet", "export-history", "--since", "7w"])
    assert bad.exit_code == 2 and "--since: '7w' is not a duration" in bad.output


def test_history_is_a_hidden_alias_of_the_telemetry_option(tmp_path: Path) -> None:
    path = _telemetry_file(tmp_path)
    new = CliRunner().invoke(main, ["fleet", "risk", "--telemetry", str(path), "--json"])
    old = CliRunner().invoke(main, ["fleet", "risk", "--history", str(path), "--json"])
    assert new.exit_code == old.exit_code == 0, old.output
    assert old.output == new.output  # the scoring time is the file's end: the same document
    assert json.loads(old.output)["nodes"][0]["node"] == "gpu07"
    helped = CliRunner().invoke(main, ["fleet", "risk", "--help"]).output
    assert "--telemetry FILE" in helped and "--history" not in helped
    both = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--history", str(path)]
    )
    assert both.exit_code == 2 and "--history is its earlier name" in both.output
    with_store = CliRunner().invoke(main, ["fleet", "risk", "--history", str(path), "--from-store"])
    assert with_store.exit_code == 2 and "exactly one of --telemetry FILE" in with_store.output


def _degrading_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path, FakeSlurm, str]:
    """The lab's inventory, a store where gpu01 and gpu02 degrade (gpu02 busy), Slurm faked."""
    root = tmp_path / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    state = tmp_path / "state"
    slurm = FakeSlurm({f"gpu{i:02d}": ("IDLE", "") for i in range(1, 9)})
    slurm.nodes["gpu02"] = ("ALLOCATED", "")
    with HistoryStore.open(history_path(state, "lab")) as store:
        for hour in range(0, 49, 2):
            for i in range(1, 9):
                sbe = (hour * 40) ** 2 // 100 if i in (1, 2) else 0  # gpu01, gpu02 degrade
                rows = hour // 8 if i in (1, 2) else 0
                counters = {"gpu/4/ecc_sbe_volatile": sbe,
                            "gpu/4/remapped_rows_correctable": rows}  # fmt: skip
                store.ingest([record(f"gpu{i:02d}", at=T0 + hour * 3600, counters=counters)])
    monkeypatch.setattr(fleet_risk, "slurm_client", lambda *_: SlurmClient(slurm, "ctl01"))
    return root, state, slurm, format_time(T0 + 48 * 3600)


def test_from_store_drain_top_drains_the_idle_degrading_node_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, slurm, at = _degrading_store(tmp_path, monkeypatch)
    args = ["fleet", "risk", "--from-store", "--inventory", str(root), "--state-dir", str(state),
            "--at", at, "--window", "2d", "--drain-top", "2", "--json"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [n["node"] for n in data["nodes"][:2]] == ["gpu01", "gpu02"]
    drains = {d["node"]: (d["action"], d["reason"]) for d in data["drains"]}
    assert drains["gpu02"][0] == "busy"
    assert drains["gpu01"][0] == "drain"
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", drains["gpu01"][1])
    assert drains["gpu01"][1].startswith("gpuforge:predicted.")
    assert slurm.nodes["gpu02"] == ("ALLOCATED", "")
    with HistoryStore.open(history_path(state, "lab")) as store:
        events = store.events(kinds=["drain"])
    assert [(e.node, e.source) for e in events] == [("gpu01", "predict")]
    card = CliRunner().invoke(main, [*args[:9], "--scorecard", "--json"])
    assert card.exit_code == 0, card.output
    assert json.loads(card.output)["counts"]["pending"] == 1
    # the loop closes: validation passes the node and admission resumes it -> a false alarm
    validate = Admission(SlurmClient(slurm), AdmissionRecord(record_path(state, "lab")), "validate")
    validate.admit([NodeVerdict("gpu01", Verdict.ADMIT)])
    assert slurm.nodes["gpu01"] == ("IDLE", "")
    card = CliRunner().invoke(main, [*args[:9], "--scorecard", "--json"])
    counts = json.loads(card.output)["counts"]
    assert (counts["false_alarm"], counts["pending"]) == (1, 0), "one prediction, counted once"


def _promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run make system-deps"  # a missing tool fails
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_nightly_run_keeps_its_report_and_metrics_in_shadow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state, slurm, at = _degrading_store(tmp_path, monkeypatch)
    policy = tmp_path / "predict.yaml"
    policy.write_text("version: 1\nwindow: 2d\ndrain:\n  threshold: 0.1\n  max_fraction: 1.0\n")
    reports, prom = tmp_path / "reports", tmp_path / "textfile" / "gpuforge_predict.prom"
    args = ["fleet", "risk", "--from-store", "--inventory", str(root), "--state-dir", str(state),
            "--at", at, "--policy", str(policy), "--report-dir", str(reports),
            "--textfile", str(prom), "--json"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (path,) = reports.iterdir()
    assert re.fullmatch(r"risk-\d{8}T\d{6}Z\.json", path.name)
    assert result.stderr == f"risk report: {path}\n"
    assert path.read_text() == result.stdout, "the --json document, byte for byte"
    data = json.loads(path.read_text())
    assert data["policy"]["drained_tonight_before"] == 0
    assert [(d["node"], d["action"]) for d in data["drains"]] == [
        ("gpu01", "drain"),
        ("gpu02", "busy"),
    ]
    assert slurm.nodes["gpu01"] == ("IDLE", ""), "shadow: nothing changed"
    text = prom.read_text()
    _promtool_accepts(text)
    assert 'gpuforge_predict_drains{mode="shadow",action="drain"} 1\n' in text
    assert 'gpuforge_predict_drains{mode="shadow",action="busy"} 1\n' in text
    assert 'gpuforge_predict_drains{mode="live",action="drain"} 0\n' in text
    assert 'gpuforge_predict_nodes{state="scored"} 8\n' in text
    assert 'gpuforge_predict_node_score{node="gpu01"} ' in text
    stamp = datetime.strptime(path.name, "risk-%Y%m%dT%H%M%SZ.json").replace(tzinfo=UTC)
    assert f"gpuforge_predict_last_run_timestamp_seconds {stamp.timestamp():.0f}\n" in text


def test_the_textfile_lists_at_most_limit_nodes_and_no_drain_without_acting(
    tmp_path: Path,
) -> None:
    path = _telemetry_file(tmp_path)
    prom = tmp_path / "risk.prom"
    result = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--limit", "0", "--textfile", str(prom)]
    )
    assert result.exit_code == 0, result.output
    assert "gpuforge_predict_node_score{" not in prom.read_text()
    assert result.stdout.splitlines()[0].startswith("fleet risk at"), "the text output stays"
    shown = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--textfile", str(prom)]
    )
    assert shown.exit_code == 0, shown.output
    text = prom.read_text()
    assert re.findall(r'gpuforge_predict_node_score\{node="([^"]+)"\}', text) == ["gpu07"]
    assert not re.search(r"gpuforge_predict_drains\{[^}]*\} [1-9]", text)
    _promtool_accepts(text)


def test_report_dir_and_textfile_are_refused_with_scorecard_and_unwritable_is_one_line(
    tmp_path: Path,
) -> None:
    path = _telemetry_file(tmp_path)
    refused = CliRunner().invoke(
        main, ["fleet", "risk", "--telemetry", str(path), "--scorecard", "--textfile", "x.prom"]
    )
    assert refused.exit_code == 2 and "not with --scorecard" in refused.output
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for option in ("--report-dir", "--textfile"):
        target = blocker / "below" / "x.prom"
        failed = CliRunner().invoke(
            main, ["fleet", "risk", "--telemetry", str(path), option, str(target)]
        )
        assert failed.exit_code == 1, failed.output
        assert failed.stderr.startswith(f"error: {option} {target}: ")
        assert len(failed.stderr.splitlines()) == 1 and "Traceback" not in failed.output
