"""inventory/sample is what the code renders today, and its site layer names real role variables."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpuforge.generate import render_files
from gpuforge.topology import load_cluster

from ..conftest import LAB, REPO

SAMPLE = REPO / "inventory" / "sample"
REFRESH = "gpuforge inventory generate examples/topologies/lab.yaml -o inventory/sample"
_COMMENTED_VAR = re.compile(r"^#\s*([a-z][a-z0-9_]*):", re.MULTILINE)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_sample_generated_layer_is_current() -> None:
    expected = render_files(load_cluster(LAB))
    actual = _tree(SAMPLE / "generated")
    stale = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
    assert not stale, f"inventory/sample/generated is stale ({stale}); run: {REFRESH}"


def _role_variables() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for defaults in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        if defaults.parents[1].name.startswith("_"):
            continue  # internal roles take their inputs from the public ones
        out[defaults.parents[1].name] = set(yaml.safe_load(defaults.read_text()) or {})
    return out


def test_site_overrides_name_variables_the_roles_define() -> None:
    roles = _role_variables()
    known = set().union(*roles.values())
    site = SAMPLE / "site" / "group_vars" / "all"
    unknown = {}
    for path in sorted(site.glob("*.yml")):
        if path.name in ("connection.yml", "mirror.yml"):
            continue  # Ansible's connection variables and the repository inputs, not role defaults
        names = set(_COMMENTED_VAR.findall(path.read_text()))
        assert names, f"{path.name} suggests no override"
        if names - known:
            unknown[path.name] = sorted(names - known)
    assert not unknown, f"inventory/sample/site names variables no role defines: {unknown}"


def test_site_override_files_point_at_each_roles_defaults() -> None:
    text = "\n".join(p.read_text() for p in (SAMPLE / "site" / "group_vars" / "all").glob("*.yml"))
    missing = [r for r in _role_variables() if f"roles/{r}/defaults/main.yml" not in text]
    assert not missing, f"no site override file points at the defaults of {missing}"


def test_site_mirror_names_the_repository_variables() -> None:
    text = (SAMPLE / "site" / "group_vars" / "all" / "mirror.yml").read_text()
    for name in ("url", "suite", "components", "key_url"):
        assert f"# gpuforge_apt_repo_{name}:" in text


def test_site_layer_sets_nothing_until_the_site_says_so() -> None:
    """Every value is commented: a new cluster directory behaves like the generated layer alone."""
    site = SAMPLE / "site"
    for path in sorted(site.rglob("*.yml")):
        data = yaml.safe_load(path.read_text())
        assert data in (None, {"all": {}}), f"{path.relative_to(SAMPLE)} sets {data}"
