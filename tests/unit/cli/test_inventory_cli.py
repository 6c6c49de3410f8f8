"""``gpuforge inventory generate``: the cluster directory, and never deleting what is not ours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuforge.cli import main

from ..conftest import EXAMPLES, LAB


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_default_is_inventory_of_the_cluster_with_both_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("inventory", "generate", LAB)
    assert result.exit_code == 0, result.output
    root = tmp_path / "inventory" / "lab"
    assert (root / "generated" / "hosts.yml").is_file()
    assert (root / "generated" / ".gpuforge-generated").is_file()
    assert (root / "site" / "group_vars" / "all" / "connection.yml").is_file()
    assert "created inventory/lab/site from the sample" in result.output


def test_regeneration_keeps_a_site_override(tmp_path: Path) -> None:
    root = tmp_path / "c"
    assert run("inventory", "generate", LAB, "-o", root).exit_code == 0
    override = root / "site" / "group_vars" / "all" / "mirror.yml"
    override.write_text("---\ngpuforge_apt_repo_url: https://mirror.site.test/\n")
    (root / "site" / "host_vars").mkdir()
    (root / "site" / "host_vars" / "gpu01.yml").write_text("---\nansible_host: 10.9.9.9\n")
    site_before = _tree(root / "site")
    (root / "generated" / "stale.yml").write_text("old: true\n")
    result = run("inventory", "generate", LAB, "-o", root)
    assert result.exit_code == 0, result.output
    assert _tree(root / "site") == site_before
    assert not (root / "generated" / "stale.yml").exists()
    assert "kept" in result.output


def test_output_dir_holding_the_specs_is_refused_and_untouched(tmp_path: Path) -> None:
    """Issue 15.1: `-o` of the directory holding the spec deleted every spec, exit 0."""
    specs = tmp_path / "t"
    shutil.copytree(EXAMPLES, specs)
    before = _tree(specs)
    result = run("inventory", "generate", specs / "lab.yaml", "-o", specs)
    assert result.exit_code == 2, result.output
    assert "refusing" in result.output
    assert _tree(specs) == before


def test_output_dir_of_the_users_own_files_is_refused_and_untouched(tmp_path: Path) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("buy cables\n")
    result = run("inventory", "generate", LAB, "-o", mine)
    assert result.exit_code == 2, result.output
    assert "not a gpuforge cluster directory" in result.output
    assert _tree(mine) == {"todo.txt": b"buy cables\n"}


def test_a_foreign_generated_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "generated").mkdir(parents=True)
    (root / "generated" / "hosts.yml").write_text("handwritten: true\n")
    result = run("inventory", "generate", LAB, "-o", root)
    assert result.exit_code == 2, result.output
    assert "gpuforge did not write it" in result.output
    assert _tree(root) == {"generated/hosts.yml": b"handwritten: true\n"}


def test_a_spec_inside_the_generated_layer_is_never_replaced(tmp_path: Path) -> None:
    root = tmp_path / "c"
    assert run("inventory", "generate", LAB, "-o", root).exit_code == 0
    spec = root / "generated" / "lab.yaml"
    shutil.copy(LAB, spec)
    result = run("inventory", "generate", spec, "-o", root)
    assert result.exit_code == 2, result.output
    assert "holds the input" in result.output
    assert spec.read_text() == LAB.read_text()


def test_a_spec_beside_the_layers_is_fine(tmp_path: Path) -> None:
    """The spec may live in its cluster directory once gpuforge made that directory."""
    root = tmp_path / "c"
    assert run("inventory", "generate", LAB, "-o", root).exit_code == 0
    spec = root / "cluster.yaml"
    shutil.copy(LAB, spec)
    assert run("inventory", "generate", spec, "-o", root).exit_code == 0
    assert spec.read_text() == LAB.read_text()


def test_a_copy_of_the_sample_is_a_cluster_directory(tmp_path: Path) -> None:
    """kubespray's habit: cp -r inventory/sample inventory/mycluster, then generate into it."""
    root = tmp_path / "mycluster"
    shutil.copytree(Path(__file__).resolve().parents[3] / "inventory" / "sample", root)
    result = run("inventory", "generate", EXAMPLES / "superpod-4su.yaml", "-o", root)
    assert result.exit_code == 0, result.output
    assert "superpod" in (root / "generated" / "group_vars" / "all.yml").read_text()
