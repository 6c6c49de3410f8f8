"""Every role declares its inputs: defaults/main.yml and meta/argument_specs.yml agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"
ROLES = sorted(p.parents[1].name for p in ROLES_DIR.glob("*/meta/argument_specs.yml"))


def _load(role: str, *parts: str) -> Any:
    return yaml.safe_load((ROLES_DIR / role).joinpath(*parts).read_text()) or {}


def _options(role: str) -> dict[str, dict[str, Any]]:
    """Every option of every entry point (the repository entry point repeats main's)."""
    options: dict[str, dict[str, Any]] = {}
    for spec in _load(role, "meta", "argument_specs.yml")["argument_specs"].values():
        options.update(spec.get("options") or {})
    return options


def test_every_role_has_argument_specs_and_defaults() -> None:
    with_tasks = {p.parents[1].name for p in ROLES_DIR.glob("*/tasks/main.yml")}
    assert with_tasks == set(ROLES)
    assert {"_common", "nvidia_driver", "slurm"} <= set(ROLES)
    for role in ROLES:
        assert (ROLES_DIR / role / "defaults" / "main.yml").is_file(), role


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_are_declared_in_argument_specs(role: str) -> None:
    assert set(_load(role, "defaults", "main.yml")) == set(_options(role))


@pytest.mark.parametrize("role", ROLES)
def test_argument_spec_defaults_equal_the_role_defaults(role: str) -> None:
    defaults = _load(role, "defaults", "main.yml")
    for name, spec in _options(role).items():
        value = defaults[name]
        templated = "{{" in str(value)
        if "default" in spec:
            assert spec["default"] == value, f"{role}: {name}"
        else:
            # Only a value computed from other variables may stay out of the spec (the README
            # table shows "computed"); a literal one must be declared where it is validated.
            assert templated or spec.get("required"), f"{role}: {name} has no default in the spec"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_is_described(role: str) -> None:
    for name, spec in _options(role).items():
        assert str(spec.get("description", "")).strip(), f"{role}: {name}"
