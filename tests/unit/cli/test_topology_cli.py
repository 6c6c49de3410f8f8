"""The topology, inventory and plan commands through click's test runner."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from gpuforge.cli import main

from ..conftest import EXAMPLES, LAB


def run(*args: str) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_check_prints_summary() -> None:
    result = run("topology", "check", LAB)
    assert result.exit_code == 0, result.output
    assert "nodes           9: 8 gpu, 1 controller, 0 login, 0 storage" in result.output
    assert "GPUs            64" in result.output
    assert "switches        16: 8 leaf, 8 spine, 0 core" in result.output
    assert "bisection       1.6 Tb/s per rail x 8 = 12.8 Tb/s" in result.output


def test_check_json() -> None:
    result = run("topology", "check", "--json", EXAMPLES / "superpod-4su.yaml")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["gpus"] == 1024
    assert data["switches"] == {"leaf": 32, "spine": 16, "core": 0}
    assert data["fabric"]["tiers"] == 2
    assert data["links"]["node_leaf"] == 1024


def test_bad_spec_exits_2_with_field_and_line(
    lab_data: dict[str, Any], write_spec: Callable[[dict[str, Any]], Path]
) -> None:
    lab_data["fabric"]["radix"] = 8
    path = write_spec(lab_data)
    result = run("topology", "check", path)
    assert result.exit_code == 2
    assert f"error: {path}:" in result.output
    assert ": fabric.radix: radix 8 at 1:1 leaves 4 node ports per leaf" in result.output


def test_missing_spec_exits_2(tmp_path: Path) -> None:
    result = run("topology", "check", tmp_path / "none.yaml")
    assert result.exit_code == 2
    assert "cannot read spec" in result.output


def test_schema_is_json_schema() -> None:
    result = run("topology", "schema")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["title"] == "gpuforge topology spec"
    assert {"fabric", "layout", "rollout", "versions"} <= set(schema["properties"])


def test_generate_writes_inventory(tmp_path: Path) -> None:
    out = tmp_path / "inv"
    result = run("inventory", "generate", LAB, "-o", out)
    assert result.exit_code == 0, result.output
    assert "9 hosts (8 GPU nodes), 2 phases" in result.output
    assert (out / "generated" / "hosts.yml").is_file()
    assert (out / "generated" / "slurm" / "topology.conf").is_file()


def test_generate_bad_spec_writes_nothing(
    lab_data: dict[str, Any], write_spec: Callable[[dict[str, Any]], Path], tmp_path: Path
) -> None:
    lab_data["versions"]["cuda"] = 12.8
    out = tmp_path / "out" / "inv"
    result = run("inventory", "generate", write_spec(lab_data), "-o", out)
    assert result.exit_code == 2
    assert "versions.cuda" in result.output
    assert not (tmp_path / "out").exists()


def test_generate_over_a_file_is_a_usage_error(tmp_path: Path) -> None:
    target = tmp_path / "inv"
    target.write_text("not a directory\n")
    result = run("inventory", "generate", LAB, "-o", target)
    assert result.exit_code == 2
    assert "is a file" in result.output
    assert target.read_text() == "not a directory\n"


def test_plan_table() -> None:
    result = run("plan", LAB)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split() == [
        "phase_01",
        "canary",
        "4",
        ">=",
        "3",
        "pass",
        "(75%)",
        "gpu[01-04]",
        "+",
        "service",
        "ctl01",
    ]
    assert lines[2].split()[:3] == ["phase_02", "wave1", "4"]


def test_plan_json() -> None:
    result = run("plan", "--json", EXAMPLES / "cluster-10k.yaml")
    assert result.exit_code == 0, result.output
    phases = json.loads(result.output)["phases"]
    assert [p["gpu_nodes"] for p in phases] == [8, 72, 400, 770]
    assert phases[1]["hosts"] == "gpu[00009-00080]"
    assert phases[3]["required_passes"] == 755  # ceil(0.98 * 770)
