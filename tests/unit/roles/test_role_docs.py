"""tools/role_docs.py: each role README's variable table comes from its argument specs."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("role_docs", REPO / "tools" / "role_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["role_docs"] = module
    spec.loader.exec_module(module)
    return module


role_docs = _load_tool()

SPEC = """\
---
argument_specs:
  main:
    short_description: A role for the test.
    options:
      demo_version:
        type: str
        default: "1.0"
        description: Exact version.
      demo_mode:
        type: str
        default: open
        choices: [open, proprietary]
        description:
          - Kernel modules.
          - Open or proprietary.
      demo_rails:
        type: list
        elements: dict
        description: Rails of the node type | from the inventory.
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository with one role that has an argument spec and no README."""
    meta = tmp_path / "roles" / "demo" / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(SPEC)
    return tmp_path


def test_every_role_readme_is_in_step_with_its_argument_specs() -> None:
    assert role_docs.stale(REPO) == []
    assert len(role_docs.roles(REPO)) == 21  # gpuforge_services joined (issue 28)
    for role in role_docs.roles(REPO):
        assert role_docs.BEGIN in (role / "README.md").read_text(), role.name


def test_the_table_shows_type_choices_default_and_description(tree: Path) -> None:
    block = role_docs.render(tree / "roles" / "demo")
    assert block.splitlines() == [
        role_docs.BEGIN,
        "| variable | type | default | description |",
        "|---|---|---|---|",
        "| `demo_version` | str | `'1.0'` | Exact version. |",
        "| `demo_mode` | str (open, proprietary) | `open` | Kernel modules. Open or proprietary. |",
        "| `demo_rails` | list of dict | computed | Rails of the node type \\| from the inventory."
        " |",
        role_docs.END,
    ]


def test_write_creates_a_missing_readme_then_check_passes(tree: Path) -> None:
    assert role_docs.main(["--check", "--root", str(tree)]) == 1
    assert role_docs.main(["--root", str(tree)]) == 0
    readme = (tree / "roles" / "demo" / "README.md").read_text()
    assert readme.startswith("# demo\n\nA role for the test.\n")
    assert role_docs.main(["--check", "--root", str(tree)]) == 0


def test_check_fails_when_a_spec_changes_and_write_keeps_the_hand_written_text(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    role = tree / "roles" / "demo"
    role_docs.main(["--root", str(tree)])
    readme = role / "README.md"
    readme.write_text(readme.read_text() + "\n## Testing\n\nBy hand.\n")
    spec = role / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace('default: "1.0"', 'default: "2.0"'))
    capsys.readouterr()
    assert role_docs.main(["--check", "--root", str(tree)]) == 1
    assert "roles/demo/README.md: variable table out of step" in capsys.readouterr().err
    assert role_docs.main(["--root", str(tree)]) == 0
    text = readme.read_text()
    assert "`'2.0'`" in text
    assert "`'1.0'`" not in text
    assert text.endswith("## Testing\n\nBy hand.\n")


def test_a_real_readme_edited_by_hand_is_reported(tmp_path: Path) -> None:
    shutil.copytree(REPO / "roles" / "dcgm", tmp_path / "roles" / "dcgm")
    readme = tmp_path / "roles" / "dcgm" / "README.md"
    readme.write_text(readme.read_text().replace("| `dcgm_version` | str | `4.2.3`", "| x |"))
    assert role_docs.stale(tmp_path) == [readme]


def test_an_unreadable_spec_is_exit_2_with_the_file_named(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tree / "roles" / "demo" / "meta" / "argument_specs.yml"
    spec.write_text(SPEC.replace("        description: Exact version.\n", ""))
    assert role_docs.main(["--check", "--root", str(tree)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {spec}: argument_specs.main.options.demo_version: description is missing\n"
    )
