"""Layers point one way: what each package may import (deliverable 6 of issue 31)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

SRC = REPO / "src" / "gpuforge"
SIM = REPO / "lab" / "sim" / "gpuforge_sim"


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
            elif node.module:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _gpuforge_imports(directory: Path, package: str) -> dict[str, set[str]]:
    return {
        p.name: {m for m in _imports(p, package) if m.startswith("gpuforge.")}
        for p in sorted(directory.glob("*.py"))
    }


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("topology", ("gpuforge.errors", "gpuforge.resources", "gpuforge.topology",
                      "gpuforge.yamlbound")),
        ("inventory", ("gpuforge.errors", "gpuforge.resources", "gpuforge.topology",
                       "gpuforge.inventory")),
    ],
)  # fmt: skip
def test_the_lower_layers_import_nothing_above_them(package: str, allowed: tuple[str, ...]) -> None:
    found = _gpuforge_imports(SRC / package, f"gpuforge.{package}")
    above = {
        name: sorted(m for m in mods if not m.startswith(allowed)) for name, mods in found.items()
    }
    assert not {k: v for k, v in above.items() if v}


def test_the_play_runner_knows_no_role() -> None:
    found = _gpuforge_imports(SRC / "execution", "gpuforge.execution")
    roles = {
        n: sorted(m for m in mods if m.startswith("gpuforge.node")) for n, mods in found.items()
    }
    assert not {k: v for k, v in roles.items() if v}
    for path in (SRC / "execution").glob("*.py"):
        assert "health" not in path.read_text(encoding="utf-8"), path.name


def test_the_simulator_imports_no_gpuforge_and_has_no_import_circle() -> None:
    graph: dict[str, set[str]] = {}
    for path in SIM.glob("*.py"):
        name = f"gpuforge_sim.{path.stem}"
        mods = _imports(path, "gpuforge_sim")
        assert not [m for m in mods if m.split(".")[0] == "gpuforge"], path.name
        graph[name] = {m for m in mods if m.startswith("gpuforge_sim.") and m.count(".") == 1}
        graph[name] &= {f"gpuforge_sim.{p.stem}" for p in SIM.glob("*.py")}
    done: set[str] = set()

    def visit(node: str, trail: tuple[str, ...]) -> None:
        assert node not in trail, " -> ".join((*trail, node))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, (*trail, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())
