"""Specs for topology, inventory and CLI tests: the lab example, to break one field at a time."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "topologies"
#: Real tool outputs: $GPUFORGE_REAL_FIXTURES, else ../shared/fixtures/real beside the repository,
#: else the shared copy of this workplace (so that a clone elsewhere, e.g. CI's, finds them).
REAL_FIXTURES = next(
    (
        p
        for p in (
            Path(os.environ.get("GPUFORGE_REAL_FIXTURES", "/nonexistent")),
            REPO.parent / "shared" / "fixtures" / "real",
            Path("/work/shared/fixtures/real"),
        )
        if p.is_dir()
    ),
    REPO.parent / "shared" / "fixtures" / "real",
)
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
