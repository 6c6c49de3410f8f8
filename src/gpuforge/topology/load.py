"""Loading a spec: YAML with line numbers, then the model, then the cross-field checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuforge.topology.check import Analysis, analyse
from gpuforge.topology.cluster import Cluster
from gpuforge.topology.errors import Problem, SpecError
from gpuforge.topology.expand import build
from gpuforge.topology.model import Topology


def load_spec(path: Path | str) -> Topology:
    """Read and validate the spec at ``path``; raise SpecError naming file, field and line."""
    return _load(path)[0]


def _load(path: Path | str) -> tuple[Topology, Analysis]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([Problem("", f"cannot read spec: {exc.strerror or exc}")], path) from None
    return _parse(text, path)


def parse_spec(text: str, path: Path | str = "<spec>") -> Topology:
    """Validate spec ``text`` (``path`` is only used in messages)."""
    return _parse(text, path)[0]


def _parse(text: str, path: Path | str) -> tuple[Topology, Analysis]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise SpecError([Problem("", f"not valid YAML: {reason}", line)], path) from None
    if root is None:
        raise SpecError([Problem("", "the spec is empty")], path)
    lines: dict[str, int] = {}
    duplicates: list[Problem] = []
    _index(root, "", lines, duplicates)
    if duplicates:
        raise SpecError(duplicates, path)
    data: Any = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SpecError([Problem("", "the spec must be a mapping of fields", 1)], path)
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_problems(exc), path).with_file(path, lines) from None
    analysis = analyse(topo)
    if analysis.problems:
        raise SpecError(analysis.problems, path).with_file(path, lines)
    return topo, analysis


def load_cluster(path: Path | str) -> Cluster:
    """Load, validate and expand the spec at ``path`` (its cross-field analysis runs once)."""
    topo, analysis = _load(path)
    try:
        return build(topo, analysis)
    except SpecError as exc:
        raise exc.with_file(path) from None


def _join(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _index(node: yaml.Node, path: str, lines: dict[str, int], dup: list[Problem]) -> None:
    """Map every field path under ``node`` to its 1-based line; collect duplicate keys."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = _join(path, key)
            if key in seen:
                dup.append(Problem(child, "duplicate key", key_node.start_mark.line + 1))
            seen.add(key)
            _index(value_node, child, lines, dup)
            lines[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, _join(path, i), lines, dup)


def _problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        path = ""
        for part in err["loc"]:
            if isinstance(part, int):
                path = _join(path, part)
            elif "[" in str(part) and "(" in str(part):
                continue  # pydantic's validator wrappers are not fields
            else:
                path = _join(path, str(part))
        message = err["msg"]
        if err["type"] == "missing":
            message = "field required"
        elif err["type"] == "extra_forbidden":
            message = "unknown field"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        problems.append(Problem(path, message))
    return problems
