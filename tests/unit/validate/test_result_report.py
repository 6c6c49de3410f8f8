"""Result model, verdict rules, JSON schema stability, JUnit validity and the HTML page."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from gpuforge.admission import REASON_MAX, verdict_reason
from gpuforge.validate.report import to_html, to_json, to_junit, write_reports
from gpuforge.validate.result import (
    EVIDENCE_MAX,
    SCHEMA_VERSION,
    BatchSummary,
    CheckResult,
    FabricFinding,
    Status,
    Verdict,
    bound_evidence,
    decide,
)


def r(node: str, check: str, status: str, **kw: object) -> CheckResult:
    return CheckResult(node=node, check=check, status=Status(status), **kw)  # type: ignore[arg-type]


def test_evidence_is_bounded_keeping_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    out = bound_evidence(text)
    assert len(out) <= EVIDENCE_MAX
    assert out.startswith("HEAD")
    assert out.endswith("TAIL")
    assert "elided" in out
    assert len(r("n", "c", "pass", evidence=text).evidence) <= EVIDENCE_MAX


def test_fail_quarantines_with_failed_check_names() -> None:
    v = decide("n1", [r("n1", "a", "pass"), r("n1", "b", "fail"), r("n1", "c", "error")])
    assert v.verdict is Verdict.QUARANTINE
    assert v.reasons == ("b",)
    assert verdict_reason(v) == "gpuforge:b:quarantine"


def test_error_holds_never_quarantines() -> None:
    v = decide("n1", [r("n1", "a", "pass"), r("n1", "c", "error"), r("n1", "w", "warn")])
    assert v.verdict is Verdict.HOLD
    assert v.reasons == ("c",)
    assert v.warnings == ("w",)


def test_warn_admits_and_no_results_hold() -> None:
    assert decide("n1", [r("n1", "w", "warn")]).verdict is Verdict.ADMIT
    assert decide("n1", []).verdict is Verdict.HOLD
    assert decide("n1", [r("n1", "s", "skip")]).verdict is Verdict.HOLD


def test_exit_codes() -> None:
    ok = BatchSummary.build(["a"], [r("a", "x", "pass")])
    assert ok.exit_code == 0
    bad = BatchSummary.build(["a", "b"], [r("a", "x", "pass"), r("b", "x", "fail")])
    assert bad.exit_code == 1
    held = BatchSummary.build(["a", "b"], [r("a", "x", "pass")])  # b has no result
    assert held.exit_code == 2
    assert held.by_verdict(Verdict.HOLD)[0].node == "b"
    fabric = BatchSummary.build(
        ["a"], [r("a", "x", "pass")], findings=(FabricFinding("leaf-uplink", "leaf1", "slow"),)
    )
    assert fabric.exit_code == 1
    assert BatchSummary.build(["a"], [r("a", "x", "pass")], fatal="no inventory").exit_code == 2


def sample() -> BatchSummary:
    results = [
        r("gpu001", "gpu.count", "pass", measured=8, expected=8, duration_s=0.5),
        r("gpu001", "nccl.allreduce_nvlink", "pass", measured=470.0, expected=">= 408"),
        r("gpu002", "gpu.count", "fail", measured=7, expected=8, evidence="<gpu>&</gpu>"),
        r("gpu002", "nccl.allreduce_nvlink", "fail", measured=120.5, expected=">= 408"),
        r("gpu003", "ib.ports", "error", message="ssh timed out"),
        r("gpu003", "driver", "skip", message="n/a"),
    ]
    return BatchSummary.build(
        ["gpu001", "gpu002", "gpu003"],
        results,
        findings=(FabricFinding("leaf-uplink", "leaf02", "slow uplink", "r1: 190 GB/s"),),
        meta={
            "floors": {"nccl.allreduce_nvlink": 408.0},
            "placement": {
                "gpu001": {"rack": "r001", "su": 1},
                "gpu002": {"rack": "r001", "su": 1},
                "gpu003": {"rack": "r002", "su": 1},
            },
        },
    )


def test_json_schema_is_stable() -> None:
    data = json.loads(to_json(sample()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert set(data) == {
        "schema_version",
        "tier",
        "started_at",
        "finished_at",
        "exit_code",
        "fatal",
        "counts",
        "meta",
        "findings",
        "notes",
        "nodes",
    }
    assert data["counts"] == {"admit": 1, "quarantine": 1, "hold": 1}
    node = data["nodes"][1]
    assert set(node) == {"node", "verdict", "reasons", "warnings", "results"}
    assert set(node["results"][0]) == {
        "node",
        "check",
        "status",
        "measured",
        "expected",
        "evidence",
        "duration_s",
        "tier",
        "message",
    }
    assert set(data["findings"][0]) == {"kind", "subject", "detail", "evidence"}
    back = CheckResult.from_dict(node["results"][0])
    assert back.to_dict() == node["results"][0]


def test_junit_is_valid_and_counts_match() -> None:
    root = ET.fromstring(to_junit(sample()))  # noqa: S314 - our own output
    assert root.tag == "testsuites"
    assert root.get("tests") == "7"  # 6 checks + 1 fabric finding
    assert root.get("failures") == "3"
    assert root.get("errors") == "1"
    assert root.get("skipped") == "1"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"gpu001", "gpu002", "gpu003", "fabric"}
    failure = suites["gpu002"].find("testcase[@name='gpu.count']/failure")
    assert failure is not None
    assert "measured: 7" in (failure.text or "")
    assert "<gpu>&</gpu>" in (failure.text or "")


def test_html_renders_with_svg_and_escapes() -> None:
    page = to_html(sample())
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 2  # busbw bars + heat map
    assert "floor 408.0" in page
    assert "&lt;gpu&gt;&amp;&lt;/gpu&gt;" in page
    assert "<script" not in page
    ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])  # noqa: S314


def test_write_reports(tmp_path: Path) -> None:
    action = {"node": "gpu002", "action": "drain", "changed": True, "detail": "gpuforge: x"}
    paths = write_reports(sample(), tmp_path / "out", actions=[action])
    assert sorted(p.name for p in paths.values()) == ["junit.xml", "report.html", "validation.json"]
    data = json.loads(paths["json"].read_text())
    assert data["slurm_actions"] == [action]
    assert "gpuforge: x" in paths["html"].read_text()


def test_excerpt_keeps_the_explanation_from_the_middle() -> None:
    from gpuforge.validate.result import excerpt  # noqa: PLC0415

    lines = [f"line {i} " + "x" * 60 for i in range(400)]
    lines[200] = "GPU 2 is running at PCI link generation 3, below 5"
    text = "\n".join(lines)
    assert "generation 3" not in bound_evidence(text)  # the old head-and-tail cut lost it
    out = excerpt(text, ["running at PCI link generation"])
    assert len(out) <= EVIDENCE_MAX
    assert "GPU 2 is running at PCI link generation 3" in out
    assert out.startswith("line 0 ")
    assert out.rstrip().endswith("x" * 60)
    assert "lines elided" in out
    assert excerpt("short", ["nothing"]) == "short"


def test_drain_reason_names_a_whole_check_within_the_limit() -> None:
    from gpuforge.validate.result import NodeVerdict  # noqa: PLC0415

    names = tuple(f"dcgm.page_retirement_row_remap[gpu{i}]" for i in range(8))
    reason = verdict_reason(NodeVerdict("n1", Verdict.QUARANTINE, names))
    assert len(reason) <= REASON_MAX
    assert reason == "gpuforge:dcgm.page_retirement_row_remap[gpu0]+7:quarantine"
    short = verdict_reason(NodeVerdict("n1", Verdict.QUARANTINE, ("dcgm.pcie[gpu2]",)))
    assert short == "gpuforge:dcgm.pcie[gpu2]:quarantine"


def test_passes_with_a_message_are_one_note_per_check_and_message() -> None:
    note = "/proc/sys is read-only on this host (a container): checked /etc/sysctl.d"
    results = [r(f"gpu0{i}", "fabric.sysctls", "pass", message=note) for i in range(1, 5)]
    results += [r("gpu05", "fabric.sysctls", "pass"), r("gpu05", "gpu.count", "fail")]
    s = BatchSummary.build([f"gpu0{i}" for i in range(1, 6)], results)
    assert s.notes() == [{"check": "fabric.sysctls", "nodes": "gpu[01-04]", "message": note}]
    assert json.loads(to_json(s))["notes"] == s.notes()
    assert s.by_verdict(Verdict.ADMIT)[0].warnings == ()  # a note is not a warning
    page = to_html(s)
    assert "<h2>Notes</h2>" in page
    assert "gpu[01-04]" in page


def test_shadow_and_streak_appear_in_the_json_only_when_set() -> None:
    plain = r("gpu01", "gpu.xid", "pass")
    assert "shadow" not in plain.to_dict() and "streak" not in plain.to_dict()
    latched = r("gpu01", "gpu.xid", "fail", action="reboot", shadow=True, streak=3)
    data = latched.to_dict()
    assert (data["shadow"], data["streak"], data["action"]) == (True, 3, "reboot")
    assert CheckResult.from_dict(data) == latched
