"""Specs for topology, inventory and CLI tests: the lab example, to break one field at a time."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "topologies"
#: Real tool outputs, vendored with their sources (tests/fixtures/real/SOURCES.md).
REAL_FIXTURES = REPO / "tests" / "fixtures" / "real"
LAB = EXAMPLES / "lab.yaml"


@pytest.fixture
def lab_data() -> dict[str, Any]:
    """The lab spec as a fresh mutable dict."""
    return copy.deepcopy(yaml.safe_load(LAB.read_text()))


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a spec dict as YAML (block style, so that every field has its own line)."""

    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
        return path

    return write


def real_fixture(relative: str) -> str:
    """The text of one real tool output; a missing file fails the test, it never skips it."""
    path = REAL_FIXTURES / relative
    if not path.is_file():
        pytest.fail(f"real fixture {path} is missing (vendored in tests/fixtures/real/)")
    return path.read_text(encoding="utf-8")
