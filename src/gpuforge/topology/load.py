"""Loading a spec: YAML with line numbers, then the model, then the cross-field checks.

Every input is bounded before it can cost time or memory: the file's size, YAML nesting depth
and alias expansion (a "billion laughs" document is refused while it is composed, before any
Python object is built). A spec that breaks a bound is a :class:`SpecError` like any other.
"""

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
from gpuforge.yamlbound import BoundedLoader

MAX_SPEC_BYTES = 64 << 10
"""The example specs (up to 100,000 GPUs) are 2-3 KiB: a spec describes groups, never single
nodes. PyYAML reads some 100 KiB/s, so this also bounds the time a spec takes to read."""
MAX_DEPTH = 64
"""YAML nesting depth; a spec is at most about six levels deep."""
MAX_NODES = 10_000
"""YAML nodes after alias expansion; the largest example spec has 266."""


class _BoundedLoader(BoundedLoader):
    """The shared bounded loader (:mod:`gpuforge.yamlbound`) with the spec's limits."""

    max_depth = MAX_DEPTH
    max_nodes = MAX_NODES
    hint = "a spec has a few hundred"


def load_spec(path: Path | str) -> Topology:
    """Read and validate the spec at ``path``; raise SpecError naming file, field and line."""
    return _load(path)[0]


def _load(path: Path | str) -> tuple[Topology, Analysis]:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([Problem("", f"cannot read spec: {exc.strerror or exc}")], path) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError([Problem("", f"larger than {MAX_SPEC_BYTES >> 10} KiB: not a spec")], path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        message = f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        raise SpecError([Problem("", message, line)], path) from None
    return _parse(text, path)


def parse_spec(text: str, path: Path | str = "<spec>") -> Topology:
    """Validate spec ``text`` (``path`` is only used in messages)."""
    return _parse(text, path)[0]


def _parse(text: str, path: Path | str) -> tuple[Topology, Analysis]:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([Problem("", f"larger than {MAX_SPEC_BYTES >> 10} KiB: not a spec")], path)
    loader = None
    try:
        loader = _BoundedLoader(text)
        root = loader.get_single_node()
        data: Any = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_problem(exc, text)], path) from None
    except (ValueError, IndexError, TypeError, OverflowError) as exc:
        # PyYAML's constructors fail this way on some tagged scalars (``!!int ''``).
        problem = f"not valid YAML: a value cannot be read ({type(exc).__name__}: {exc})"
        raise SpecError([Problem("", problem)], path) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise SpecError([Problem("", "the spec is empty")], path)
    lines: dict[str, int] = {}
    duplicates: list[Problem] = []
    _index(root, "", lines, duplicates)
    if duplicates:
        raise SpecError(duplicates, path)
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


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    """One line for a YAML error: PyYAML's own messages span several lines."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        reason = f"character {exc.character!r} is not allowed ({exc.reason})"
    else:
        reason = getattr(exc, "problem", None) or str(exc)
    return Problem("", f"not valid YAML: {' '.join(str(reason).split())}", line)


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
