"""``gpuforge deploy`` and ``status`` name their cluster; deploy reads a cluster directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuforge.cli import main
from gpuforge.generate import write_inventory
from gpuforge.topology import load_cluster

from ..conftest import LAB


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("command", [["deploy", "--phase", "1"], ["status"]])
def test_spec_is_required(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No silent lab default: against a real cluster it would act on the wrong one."""
    monkeypatch.chdir(tmp_path)
    result = run(*command)
    assert result.exit_code == 2, result.output
    assert "Missing argument 'SPEC'" in result.output
    assert not (tmp_path / "state").exists()


def test_deploy_without_a_cluster_directory_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("deploy", "--phase", "1", LAB)
    assert result.exit_code == 2, result.output
    assert "gpuforge inventory generate SPEC -o inventory/lab" in result.output
    assert not (tmp_path / "state").exists()


def test_deploy_refuses_the_old_single_directory_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_inventory(load_cluster(LAB), tmp_path / "old")
    result = run("deploy", "--phase", "1", LAB, "--inventory", tmp_path / "old")
    assert result.exit_code == 2, result.output
    assert "old single-directory layout" in result.output
