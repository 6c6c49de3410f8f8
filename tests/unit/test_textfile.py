"""The textfile writer: the exposition format, its escaping, exact values, atomic files.

Every textfile gpuforge writes goes through :mod:`gpuforge.textfile`; promtool's own parser
(``promtool check metrics``) reads what each producer renders.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuforge import textfile
from gpuforge.conformance import report
from gpuforge.health import fleet
from gpuforge.node import config, drift, output, record, state
from gpuforge.textfile import Family, render, value_text
from gpuforge.validate.result import CheckResult, Status


def _promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    # make system-deps installs Debian's prometheus (promtool): a missing tool fails, never skips.
    assert path, "promtool not found: run make system-deps"
    return subprocess.run(
        [path, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_family_renders_help_type_and_samples_in_order() -> None:
    text = render(
        [
            Family("gpuforge_x", "An x.", "gauge", [({"b": "2", "a": "1"}, 1), ({}, 2.5)]),
            Family.single("gpuforge_y_total", "A y.", 7, "counter"),
            Family("gpuforge_empty", "Nothing yet.", "gauge", []),
        ]
    )
    assert text == (
        "# HELP gpuforge_x An x.\n"
        "# TYPE gpuforge_x gauge\n"
        'gpuforge_x{b="2",a="1"} 1\n'
        "gpuforge_x 2.5\n"
        "# HELP gpuforge_y_total A y.\n"
        "# TYPE gpuforge_y_total counter\n"
        "gpuforge_y_total 7\n"
        "# HELP gpuforge_empty Nothing yet.\n"
        "# TYPE gpuforge_empty gauge\n"
    )
    assert render([]) == ""


def test_label_values_and_help_are_escaped() -> None:
    hostile = 'gpu01"} 1\nevil_metric{a="b\\'
    text = render([Family("gpuforge_x", "back\\slash\nnewline", "gauge", [({"node": hostile}, 1)])])
    assert text.splitlines() == [
        "# HELP gpuforge_x back\\\\slash\\nnewline",
        "# TYPE gpuforge_x gauge",
        'gpuforge_x{node="gpu01\\"} 1\\nevil_metric{a=\\"b\\\\"} 1',
    ]
    proc = _promtool_check(text)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (True, "1"),
        (123456789, "123456789"),
        (0.0, "0"),
        (1764650000.0, "1764650000"),
        (1764650000.125, "1764650000.125"),  # ":g" would write 1.76465e+09
        (0.1, "0.1"),
        (1e-7, "1e-07"),
        (2.0**60, "1.152921504606847e+18"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (float("nan"), "NaN"),
    ],
)
def test_values_are_written_exactly(value: float, text: str) -> None:
    assert value_text(value) == text


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("gpuforge-x", "h", "gauge", []), "metric name"),
        (("gpuforge_x", "h", "histogram", []), "type"),
        (("gpuforge_x", "h", "gauge", [({"bad-label": "v"}, 1)]), "label name"),
        (("gpuforge_x", "h", "gauge", [({"__name__": "v"}, 1)]), "label name"),
    ],
)
def test_a_malformed_family_is_refused(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Family(*args)  # type: ignore[arg-type]


def test_write_replaces_the_file_atomically_readable_by_the_exporter(tmp_path: Path) -> None:
    path = tmp_path / "textfile" / "gpuforge_x.prom"
    families = [Family.single("gpuforge_x", "An x.", 1)]
    assert textfile.write(path, families) == path
    assert path.read_text() == render(families)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    textfile.write(path, "# HELP gpuforge_x An x.\n# TYPE gpuforge_x gauge\ngpuforge_x 2\n")
    assert path.read_text().endswith("gpuforge_x 2\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["gpuforge_x.prom"]  # no temporary


def test_every_producer_renders_what_promtool_reads() -> None:
    status = fleet.FleetStatus(
        "lab",
        1e9,
        300.0,
        (
            fleet.NodeStatus("gpu01", "fail", stale=False, drained_by="gpuforge"),
            fleet.NodeStatus("gpu02", fleet.NO_RECORD),
        ),
        slurm_read=True,
    )
    changes = SimpleNamespace(
        counts=lambda: {"pass": 3, "fail": 1},
        drift_by_kind={"package": 2},
        run=SimpleNamespace(state="partial", finished=1764650000.7),
    )
    streaks = {"gpu.xid": state.Streak(fails=3, latched=True, action="reboot")}
    failed = (CheckResult("", "gpu.xid", Status.FAIL, measured="1", expected="0"),)
    run = record.Record("gpu01", "passive", "t", 1.5, "fail", failed)
    node = output.metrics_text(
        run,
        config.parse("version: 1\nnode: gpu01\n"),
        state.State(streaks=streaks, spool_dropped=1_234_567),
        spooled=2,
        now=1764650000.123,
    )
    # exact: the ":g" this replaced wrote 1.76465e+09 and 1.23457e+06
    assert 'gpuforge_health_last_run_timestamp_seconds{tier="passive"} 1764650000.123\n' in node
    assert "gpuforge_health_spool_dropped_total 1234567\n" in node
    texts = {
        "node": node,
        "drift": drift.metrics_text({"drift": [{"kind": "module"}], "verdict": "warn"}, 1e9 + 0.4),
        "fleet": fleet.controller_metrics(status, fleet.BreakerState(True, 4, ("gpu03",))),
        "conformance": report.metrics(changes, now=5.0),  # type: ignore[arg-type]
    }
    assert "gpuforge_conformance_last_run_timestamp_seconds 1000000000\n" in texts["drift"]
    assert (
        "gpuforge_conformance_fleet_last_run_timestamp_seconds 1764650001\n"
        in (texts["conformance"])
    )
    assert 'gpuforge_fleet_drained_nodes{by="gpuforge"} 1\n' in texts["fleet"]
    for name, text in texts.items():
        proc = _promtool_check(text)
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
