"""The conformance report as an operator reads it: empty sections say so, healthy racks are
counted right, and a drifted file shows its diff against what the role rendered."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gpuforge.conformance import report
from gpuforge.conformance.run import ConformanceOptions, run
from gpuforge.history.conformance import ConformanceHistory, ConformanceRun, NodeResult
from gpuforge.node import drift, filediff

from .test_run import FLEET, World, deps_for, history, world  # noqa: F401 - fixtures

CONF = "/etc/nvidia-fabricmanager/fabricmanager.cfg"
RENDERED = "".join(f"SETTING_{i}=<{i}>\n" for i in range(30))


def _drifted(node: str) -> dict[str, object]:
    actual = RENDERED.replace("SETTING_7=<7>", "SETTING_7=<700>")
    item = drift.DriftItem("file", CONF, "sha256:" + "a" * 64, "sha256:" + "b" * 64, "fabric")
    diffs = [filediff.bounded_diff(CONF, RENDERED, actual)]
    rep = drift.DriftReport(items=[item], roles=["fabric"], compared=3, diffs=diffs)
    return drift.conformance_record(
        node, "quick", started="2026-11-18T10:00:00Z", duration_s=1.0, report=rep,
        firmware_versions={"vbios": "96.00.89"}, job_id="77",
    )  # fmt: skip


def _tables_are_never_empty(page: str) -> None:
    for table in re.findall(r"<table.*?</table>", page, re.S):
        assert table.count("<tr>") >= 2, table


def test_a_drifted_file_shows_its_diff_and_empty_sections_say_so(
    tmp_path: Path,
    world: World,  # noqa: F811
    history: ConformanceHistory,  # noqa: F811
) -> None:
    world.records["gpu01"] = _drifted("gpu01")
    world.records["gpu04"] = _drifted("gpu04")
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes
    paths = report.write(changes, tmp_path / "out")
    page = paths["html"].read_text()
    assert "Changed files, against what the role rendered" in page
    assert "gpu[01,04] (2 nodes)" in page
    assert '<span class="del">-SETTING_7=&lt;7&gt;</span>' in page  # escaped
    assert '<span class="add">+SETTING_7=&lt;700&gt;</span>' in page
    assert "First run: nothing to compare with." in page  # what changed, drift fixed
    assert "No node failed 2 or more times in 7 days." in page
    assert "No node reported a flapping link." in page
    assert "0 rack(s)" not in page
    _tables_are_never_empty(page)
    assert '<div class="wrap"><table class="failures">' in page
    data = json.loads(paths["json"].read_text())
    [group] = data["run"]["meta"]["file_diffs"]
    assert group["nodes"] == "gpu[01,04]" and group["count"] == 2
    assert "+SETTING_7=<700>" in group["diff"]
    junit = ET.fromstring(paths["junit"].read_text())  # noqa: S314 - our own file
    assert junit.tag == "testsuites" and junit.get("failures") == "2"
    assert [s.get("tests") for s in junit] == ["6"]


def test_healthy_racks_sentence() -> None:
    assert report.healthy_racks_text({}) == "No rack to show: no node was placed in a rack."
    assert report.healthy_racks_text({"r1": {"fail": 1}}) == "No rack is all healthy (of 1 rack)."
    two = {"r1": {"pass": 4}, "r2": {"warn": 1, "pass": 3}}
    assert report.healthy_racks_text(two) == "All 2 racks healthy: r1, r2"
    assert report.healthy_racks_text({"r1": {"pass": 1}}) == "The rack is all healthy: r1"
    mixed = {**two, "r3": {"fail": 1}}
    assert report.healthy_racks_text(mixed) == "2 of 3 racks all healthy: r1, r2"
    many = {f"r{i:03d}": {"pass": 1} for i in range(45)} | {"bad": {"error": 1}}
    assert report.healthy_racks_text(many).endswith("r039 ... (5 more)")


def test_a_quiet_run_has_no_empty_table() -> None:
    results = {f"gpu0{i}": NodeResult(f"gpu0{i}", "pass") for i in range(1, 4)}
    previous = ConformanceRun(1, 0.0, 10.0, "quick", "complete", 3)
    changes = report.Changes(
        ConformanceRun(2, 100.0, 110.0, "quick", "complete", 3), previous, results
    )
    changes.heat = report.heat_map(results, {n: report.Placement("su01", "r001") for n in results})
    page = report.render_html(changes)
    for sentence in (
        "Nothing changed since the previous run",
        "No drift was fixed since the previous run.",
        "No node failed.",
        "No item drifted.",
        "Every node was checked.",
        "The rack is all healthy: r001",
        "No leaf has a failing node.",
    ):
        assert sentence in page, sentence
    assert "Changed files" not in page
    _tables_are_never_empty(page)
