"""Fuzzing the spec loader: whatever the bytes, the answer is a spec or a SpecError, quickly."""

from __future__ import annotations

import contextlib
import copy
import math
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuforge.topology import SpecError, load_cluster, parse_spec

from ..conftest import LAB

FUZZ = settings(
    # GPUFORGE_FUZZ_EXAMPLES=5000 runs a longer, random (not derandomized) search.
    max_examples=int(os.environ.get("GPUFORGE_FUZZ_EXAMPLES", "100")),
    deadline=None if "GPUFORGE_FUZZ_EXAMPLES" in os.environ else 2000,
    derandomize="GPUFORGE_FUZZ_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LAB_DATA: dict[str, Any] = yaml.safe_load(LAB.read_text())
LAB_TEXT = LAB.read_text()

# Pieces of YAML syntax, so that random documents reach the composer and constructor.
_TOKENS = st.sampled_from(
    [
        "&a ",
        "*a",
        "&b ",
        "*b",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "- ",
        ", ",
        "\n",
        "\n  ",
        "\t",
        "!!str ",
        "!!int ",
        "!!binary ",
        "!!python/object:os.system ",
        "? ",
        "|\n  ",
        ">\n  ",
        "'",
        '"',
        "#",
        "---\n",
        "...\n",
        "name",
        "node_groups",
        "gpu{index:02d}",
        "1e999",
        ".nan",
        "~",
        "0x1F",
        "2001-01-01",
        "\x00",
        "\ufeff",
        "\x85",
        "é",
    ]
)
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_paths(value, (*prefix, i)))
    return out


LAB_PATHS = _paths(LAB_DATA)[1:]


def _accepts_or_refuses(text: str) -> None:
    try:
        parse_spec(text, "fuzz.yaml")
    except SpecError as exc:
        message = str(exc)
        assert message.startswith(("fuzz.yaml", f"{len(exc.problems)} problems in fuzz.yaml"))
        assert len(message) < 60 * 400


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes(tmp_path_factory: Any, data: bytes) -> None:
    spec = Path(tmp_path_factory.mktemp("fuzz")) / "spec.yaml"
    spec.write_bytes(data)
    with contextlib.suppress(SpecError):
        load_cluster(spec)


@FUZZ
@given(st.lists(_TOKENS, max_size=60).map("".join))
def test_yaml_syntax_soup(text: str) -> None:
    _accepts_or_refuses(text)


@FUZZ
@given(st.integers(min_value=0, max_value=len(LAB_TEXT)), st.binary(max_size=40))
def test_lab_spec_cut_and_spliced(cut: int, junk: bytes) -> None:
    _accepts_or_refuses(LAB_TEXT[:cut] + junk.decode("latin-1") + LAB_TEXT[cut:][len(junk) :])


@FUZZ
@given(st.sampled_from(LAB_PATHS), _VALUES)
def test_one_field_replaced(path: tuple[Any, ...], value: Any) -> None:
    data = copy.deepcopy(LAB_DATA)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if isinstance(value, float) and not math.isfinite(value):
        text = yaml.safe_dump(data)  # .nan / .inf, as a person would write them
    else:
        text = yaml.safe_dump(data, allow_unicode=True)
    try:
        topo = parse_spec(text, "fuzz.yaml")
    except SpecError:
        return
    assert topo.name  # accepted: then it also expands


# Pieces of str.format syntax: a hostname pattern is formatted with each node's index.
_FORMAT_TOKENS = st.sampled_from(
    [
        "}",
        "{",
        "index",
        "[0]",
        ".real",
        ".__class__",
        "!r",
        "!a",
        ":",
        "0",
        "9",
        "63",
        "64",
        "d",
        "x",
        "c",
        "n",
        "e",
        "%",
        ",",
        "_",
        ">",
        "^",
        "=",
        "+",
        "#",
        ".3",
        "{}",
        "{{",
        "-",
    ]
)


@FUZZ
@given(
    st.lists(_FORMAT_TOKENS, max_size=12).map("".join),
    st.integers(min_value=0, max_value=2_000_000),
)
def test_hostname_pattern(tail: str, first_index: int) -> None:
    """A pattern is a hostname or a SpecError ({index[0]} ended in TypeError)."""
    data = copy.deepcopy(LAB_DATA)
    data["node_groups"][1].update(hostname="gpu{index" + tail, first_index=first_index)
    _accepts_or_refuses(yaml.safe_dump(data))
