"""The execution_host role installs exactly the versions gpuforge pins and checks for."""

from __future__ import annotations

import re
import tomllib

import yaml

from gpuforge.execution.executors import PINNED, controller_versions
from gpuforge.resources import project_path


def _role_pins() -> dict[str, str]:
    defaults = yaml.safe_load(
        project_path("roles", "execution_host", "defaults", "main.yml").read_text()
    )
    return {str(k): str(v) for k, v in defaults["execution_host_packages"].items()}


def test_role_pins_are_the_pyproject_pins() -> None:
    deps = tomllib.loads(project_path("pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        match = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", dep)
        if match:
            pins[match[1]] = match[2]
    assert _role_pins() == {name: pins[name] for name in PINNED}


def test_role_pins_are_what_the_preflight_wants() -> None:
    assert _role_pins() == controller_versions()


def test_argument_spec_default_matches_defaults() -> None:
    spec = yaml.safe_load(
        project_path("roles", "execution_host", "meta", "argument_specs.yml").read_text()
    )
    options = spec["argument_specs"]["main"]["options"]
    assert {str(k): str(v) for k, v in options["execution_host_packages"]["default"].items()} == (
        _role_pins()
    )
