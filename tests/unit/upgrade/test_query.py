"""The quick query of installed versions: its parser, the parallel runner, the CLI path."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.cli import upgrade as upgrade_cli
from gpuforge.command import CommandResult
from gpuforge.upgrade.query import QUERY, parse_query, query_installed

from ..conftest import LAB

OUTPUT = """@@driver
570.124.06
570.124.06
@@dpkg
nvidia-fabricmanager-570\t570.124.06-1\tinstalled
cuda-toolkit-12-6\t12.6.3-1\tinstalled
cuda-toolkit-12-8\t12.8.1-1\tinstalled
cuda-toolkit-config-common\t12.8.90-1\tinstalled
libnccl2\t2.25.1-1+cuda12.8\tinstalled
libnccl2-old\t2.18.1-1\tconfig-files
datacenter-gpu-manager-4-core\t1:4.2.3-1\tinstalled
slurmd\t22.05.8-4\tinstalled
libpmix2\t4.2.2-1\tinstalled
@@kernel
6.1.0-28-amd64
"""

NEW_OUTPUT = OUTPUT.replace("570.124.06", "570.133.20").replace("2.25.1-1", "2.26.2-1")


def test_parse_query_reads_every_component() -> None:
    assert parse_query(OUTPUT) == {
        "nvidia_driver": "570.124.06",
        "fabricmanager": "570.124.06-1",
        "cuda": "12.8.1-1",
        "nccl": "2.25.1-1+cuda12.8",
        "dcgm": "1:4.2.3-1",
        "slurm": "22.05.8-4",
        "pmix": "4.2.2-1",
        "kernel": "6.1.0-28-amd64",
    }


def test_parse_query_absent_tools() -> None:
    got = parse_query("@@driver\n@@dpkg\nslurmd\t22.05.8-4\tinstalled\n@@kernel\n6.1.0-28-amd64\n")
    assert got is not None
    assert got["nvidia_driver"] is None
    assert got["nccl"] is None
    assert "doca_ofed" not in got  # not installed: nothing to compare, not "absent"


def test_parse_query_refuses_foreign_output() -> None:
    assert parse_query("bash: dpkg-query: command not found\n") is None


@dataclass
class FakeRunner:
    answers: Mapping[str, CommandResult]
    commands: list[tuple[str, str, float]] = field(default_factory=list)

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        self.commands.append((host, command, timeout))
        return self.answers[host]


def _answer(host: str, stdout: str, rc: int = 0, timed_out: bool = False) -> CommandResult:
    return CommandResult(host, QUERY, rc, stdout, "", 0.1, timed_out)


def test_query_installed_collects_answers_and_silent_hosts() -> None:
    runner = FakeRunner(
        {
            "gpu01": _answer("gpu01", OUTPUT),
            "gpu02": _answer("gpu02", "", rc=255),
            "gpu03": _answer("gpu03", OUTPUT, rc=124, timed_out=True),
        }
    )
    found, silent = query_installed(runner, ["gpu01", "gpu02", "gpu03"], timeout=7)
    assert set(found) == {"gpu01"}
    assert found["gpu01"].versions["nvidia_driver"] == "570.124.06"
    assert sorted(silent) == ["gpu02", "gpu03"]
    assert {t for _, _, t in runner.commands} == {7}


@dataclass
class FakeView:
    gpu_nodes: list[str]

    def all_hostvars(self) -> dict[str, dict[str, Any]]:
        return {h: {"ansible_host": f"10.0.0.{i}"} for i, h in enumerate(self.gpu_nodes)}


def test_cli_plan_with_inventory_queries_the_nodes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    nodes = [f"gpu{i:02d}" for i in range(1, 9)]
    answers = {h: _answer(h, OUTPUT if h in ("gpu01", "gpu05") else NEW_OUTPUT) for h in nodes}
    answers["gpu08"] = _answer("gpu08", "", rc=255)
    seen: dict[str, Any] = {}

    def fake_runner(targets: Mapping[str, Any]) -> FakeRunner:
        seen["targets"] = targets
        return FakeRunner(answers)

    monkeypatch.setattr(upgrade_cli.ClusterView, "load", lambda _path: FakeView(nodes))
    monkeypatch.setattr(upgrade_cli, "SshRunner", fake_runner)
    result = CliRunner().invoke(
        main,
        ["upgrade", "plan", str(LAB), "--inventory", str(tmp_path), "--json",
         "--max-per-leaf", "4", "--max-fraction", "0.5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no answer within 30s from gpu08 (1): planned as unknown" in result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert [w["nodes"] for w in data["waves"]] == [["gpu01"], ["gpu05", "gpu08"]]
    assert data["unknown"] == ["gpu08"]
    assert seen["targets"]["gpu01"].address == "10.0.0.0"
