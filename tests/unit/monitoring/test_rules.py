"""Alert and recording rules: promtool accepts them, and every alert has tests and a runbook."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.monitoring import rules
from gpuforge.topology.load import load_cluster

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "topologies"
PROMTOOL_TESTS = Path(__file__).with_name("promtool")
CHECKED_IN = REPO / "roles" / "prometheus" / "files" / "rules" / rules.ALERTS_FILE
RUNBOOKS = REPO / rules.RUNBOOK_DIR
#: Sections every alert runbook has (the issue: what it means, what to check first, the command,
#: when to drain, when to RMA).
RUNBOOK_SECTIONS = ("## What it means", "## Check first", "## Commands", "## Drain", "## RMA")


def _promtool() -> str:
    path = shutil.which("promtool")
    # make system-deps installs Debian's prometheus (promtool): a missing tool fails, never skips.
    assert path, "promtool not found: run make system-deps"
    return path


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=180, check=False
    )


def _write_rules(out: Path, spec: str = "lab.yaml") -> list[Path]:
    files = rules.render_rules(load_cluster(EXAMPLES / spec))
    paths = []
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    return paths


def _test_files() -> list[Path]:
    return sorted(PROMTOOL_TESTS.glob("*.test.yml"))


def _load_test(path: Path) -> dict[str, Any]:
    # Top-level x-* keys only hold YAML anchors (promtool refuses unknown keys).
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("x-")}


@pytest.mark.parametrize("spec", ["lab.yaml", "lab-roce.yaml", "superpod-4su.yaml", "nvl72.yaml"])
def test_promtool_accepts_the_rules(tmp_path: Path, spec: str) -> None:
    paths = _write_rules(tmp_path, spec)
    result = _run("check", "rules", *map(str, paths))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    _write_rules(tmp_path)
    names = []
    for path in _test_files():
        (tmp_path / path.name).write_text(yaml.safe_dump(_load_test(path), sort_keys=False))
        names.append(path.name)
    assert names, f"no promtool tests in {PROMTOOL_TESTS}"
    result = _run("test", "rules", *names, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_promtool_unit_tests_fail_on_a_wrong_rule(tmp_path: Path) -> None:
    """The unit tests can fail: a rack budget twice as large silences RackPowerOverBudget."""
    _write_rules(tmp_path)
    records = tmp_path / rules.RECORDS_FILE
    records.write_text(records.read_text().replace("vector(44000)", "vector(88000)"))
    path = PROMTOOL_TESTS / "alerts.test.yml"
    (tmp_path / path.name).write_text(yaml.safe_dump(_load_test(path), sort_keys=False))
    result = _run("test", "rules", path.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "RackPowerOverBudget" in result.stdout + result.stderr


def _cases() -> dict[str, dict[str, int]]:
    """alertname -> {"firing": n, "silent": n} over every promtool test case."""
    seen: dict[str, dict[str, int]] = {}
    for path in _test_files():
        for test in _load_test(path)["tests"]:
            for case in test.get("alert_rule_test", []):
                kind = "firing" if case.get("exp_alerts") else "silent"
                seen.setdefault(case["alertname"], {"firing": 0, "silent": 0})[kind] += 1
    return seen


ALERTS = rules.alerts()


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
def test_every_alert_is_tested_firing_and_silent(alert: rules.Alert) -> None:
    counts = _cases().get(alert.name, {"firing": 0, "silent": 0})
    assert counts["firing"] >= 1, f"{alert.name}: no promtool case where it fires"
    assert counts["silent"] >= 1, f"{alert.name}: no promtool case where it stays silent"


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
def test_every_alert_has_severity_summary_and_runbook(alert: rules.Alert) -> None:
    rule = alert.rule()
    assert rule["labels"]["severity"] in rules.SEVERITIES
    assert rule["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{alert.name}.md")
    summary = rule["annotations"]["summary"]
    assert "$labels.node" in summary or "$labels.rack" in summary, summary
    if alert.expr.startswith("DCGM_FI_DEV_") or "DCGM_FI_DEV_XID" in alert.expr:
        assert "$labels.gpu" in summary, f"{alert.name}: a GPU alert names the GPU"
    if "node_infiniband_" in alert.expr:
        assert "$labels.device" in summary and "$labels.port" in summary
    runbook = RUNBOOKS / f"{alert.name}.md"
    assert runbook.is_file(), f"{alert.name}: missing runbook {runbook.relative_to(REPO)}"
    text = runbook.read_text(encoding="utf-8")
    assert text.startswith(f"# {alert.name}\n"), f"{runbook.name}: first line is '# {alert.name}'"
    for section in RUNBOOK_SECTIONS:
        assert section in text, f"{runbook.name}: no '{section}' section"
    assert "gpuforge " in text, f"{runbook.name}: names no gpuforge command"
    assert f"```promql\n{alert.expr}\n```" in text, f"{runbook.name}: quote the rule's expression"


def test_no_runbook_without_an_alert() -> None:
    names = {a.name for a in ALERTS}
    # docs/runbooks also holds helper C's per-action runbooks (lower-case names).
    orphans = [
        p.name for p in RUNBOOKS.glob("*.md") if p.stem[:1].isupper() and p.stem not in names
    ]
    assert not orphans


def test_the_checked_in_alerts_file_is_in_step() -> None:
    assert CHECKED_IN.read_text(encoding="utf-8") == rules.alerts_file(), (
        "run: .venv/bin/python -m gpuforge.monitoring.rules"
    )


def test_xid_classes_follow_the_catalogue() -> None:
    by_name = {a.name: a for a in ALERTS}
    reset = by_name["GpuXidResetGpu"].expr
    assert "DCGM_FI_DEV_XID_ERRORS == 48" in reset  # double-bit ECC: reset_gpu
    assert "== 79" not in by_name["GpuXidReboot"].expr  # its own alert
    assert "== 13 " in by_name["GpuXidApplication"].expr + " "
    for alert in ALERTS:
        if alert.name.startswith("GpuXid") and alert.name != "GpuXidApplication":
            assert "== 13 " not in alert.expr + " ", alert.name  # application Xids never page


def _records(spec: str) -> list[dict[str, Any]]:
    return rules.spec_records(load_cluster(EXAMPLES / spec))


def test_one_power_budget_per_gpu_rack() -> None:
    cluster = load_cluster(EXAMPLES / "lab.yaml")
    budgets = [r for r in _records("lab.yaml") if r["record"] == "gpuforge:rack_power_budget_watts"]
    gpu_racks = sorted({n.rack for n in cluster.nodes if n.role == "gpu"})
    assert [r["labels"]["rack"] for r in budgets] == gpu_racks == ["r001", "r002"]
    assert {r["expr"] for r in budgets} == {"vector(44000)"}  # layout.rack_power_kw: 44


def test_base_load_is_the_peak_less_the_gpus() -> None:
    base = next(r for r in _records("lab.yaml") if r["record"] == "gpuforge:node_base_power_watts")
    assert base["expr"] == "vector(4600)"  # 10.2 kW - 8 x 700 W
    assert base["labels"] == {"cluster": "lab", "node_type": "h100-sxm"}


def test_expected_port_rate_per_rail() -> None:
    rates = [
        r
        for r in _records("lab.yaml")
        if r["record"] == "gpuforge:ib_port_expected_rate_bytes_per_second"
    ]
    assert [r["labels"]["device"] for r in rates] == [f"mlx5_{i}" for i in range(8)]
    assert {r["expr"] for r in rates} == {"vector(5e+10)"}  # 400 Gb/s = 50 GB/s


def test_rail_leaves_only_on_a_rail_optimised_fabric() -> None:
    leaves = [r for r in _records("lab.yaml") if r["record"] == "gpuforge:rail_leaf_info"]
    assert {(r["labels"]["device"], r["labels"]["leaf"]) for r in leaves} == {
        (f"mlx5_{i}", f"leaf-su01-r{i}") for i in range(8)
    }
    cluster = load_cluster(EXAMPLES / "superpod-4su.yaml")
    if not cluster.fabric.rail_optimized:
        assert not [r for r in _records("superpod-4su.yaml") if "rail_leaf" in r["record"]]


def test_records_for_12500_nodes_are_quick() -> None:
    cluster = load_cluster(EXAMPLES / "cluster-10k.yaml")
    start = time.process_time()  # CPU seconds: a loaded machine's wait is not ours
    text = rules.records_file(cluster)
    elapsed = time.process_time() - start
    racks = {n.rack for n in cluster.nodes if n.role == "gpu"}
    assert text.count("record: gpuforge:rack_power_budget_watts") == len(racks)
    assert elapsed < 2.0


def test_summaries_are_valid_templates() -> None:
    # Go templates: every {{ opens and closes (promtool check rules parses them as well).
    for alert in ALERTS:
        summary = alert.rule()["annotations"]["summary"]
        assert summary.count("{{") == summary.count("}}"), alert.name
        assert not re.search(r"\{\{[^}]*\{\{", summary), alert.name


def _pyyaml(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=rules._Dumper, sort_keys=False, width=100, allow_unicode=True)


@pytest.mark.parametrize(
    "spec", sorted(p.name for p in EXAMPLES.glob("*.yaml") if "100k" not in p.name)
)
def test_records_are_the_bytes_pyyaml_writes(spec: str) -> None:
    """The fast writer of the records file writes what PyYAML's emitter would, byte for byte."""
    cluster = load_cluster(EXAMPLES / spec)
    doc = {"groups": [{"name": "g", "interval": "1m", "rules": rules.spec_records(cluster)}]}
    fast = rules._BlockWriter().dump(doc)
    assert fast is not None
    assert fast == _pyyaml(doc)


_TRICKY = [
    "1", "1.5", "0x1F", "1e3", "yes", "no", "on", "null", "~", "true", "", "'", "a'b", '"q"',
    "-", "-x", ":x", "x:", "x:y", "#x", "x#y", "&a", "*a", "!t", "%p", "@a", "`b", "[a]",
    "{a}", "a,b", "?", "?x", "|", ">", "é", "2026-12-02", "12:30", "+1", ".inf", "=", "<<",
    "a" * 119, "a\tb", "a b", "a\nb",
    # Tokens (letters, digits, _ . -): PyYAML's resolver alone decides whether they are quoted.
    "y", "n", "Y", "off", "Off", "NULL", "True", "012", "0o17", "1_000", "0b101", "0.", "1..2",
    "1.5e3", "nan", "inf", "a.b", "x-", "0", "r0001", "leaf-su001-r0", "a_b", "1-2", "_x", "-1",
    "1:2", "190:20:30", "2026-12-02t10:00:00", "0:0",
]  # fmt: skip


@pytest.mark.parametrize("value", _TRICKY)
def test_the_fast_writer_quotes_as_pyyaml_or_leaves_it_to_pyyaml(value: str) -> None:
    doc: dict[str, Any] = {"groups": [{"name": value, "rules": [{"labels": {"k": value}}]}]}
    doc["list"] = [value, 3, {value or "k": value}]
    fast = rules._BlockWriter().dump(doc)
    if fast is not None:
        assert fast == _pyyaml(doc)
    assert rules._dump(doc, "x").endswith(_pyyaml(doc))


def test_the_fast_writer_leaves_other_documents_to_pyyaml() -> None:
    writer = rules._BlockWriter()
    assert writer.dump({"a": []}) is None
    assert writer.dump({"a": {}}) is None
    assert writer.dump({"a": True}) is None
    assert writer.dump({"a": [[1]]}) is None
    assert writer.dump({"a": "two words"}) is None
    assert writer.dump({}) is None
