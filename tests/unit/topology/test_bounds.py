"""Hostile specs end in one line naming the file (and line), exit 2, within 1 s and 200 MB."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.topology import SpecError, load_spec, parse_spec
from gpuforge.topology.check import hostlist_size

from ..conftest import LAB


def _alias_bomb(levels: int) -> str:
    """The 'billion laughs' document: each level repeats the one before nine times."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _latin1_comment() -> bytes:
    return LAB.read_bytes() + b"# caf\xe9 au lait\n"


def _deep(levels: int) -> bytes:
    return b"a: " + b"[" * levels + b"]" * levels + b"\n"


def _huge_width(data: dict[str, Any]) -> bytes:
    data["node_groups"][1]["hostname"] = "gpu{index:0400000000d}"
    return yaml.safe_dump(data, sort_keys=False).encode()


def _nested_width(data: dict[str, Any]) -> bytes:
    data["node_groups"][1].update(hostname="gpu{index:{index}}", first_index=100_000)
    return yaml.safe_dump(data, sort_keys=False).encode()


def _indexed_field(data: dict[str, Any]) -> bytes:
    data["node_groups"][1]["hostname"] = "gpu{index[0]}"  # ended in TypeError, exit 1
    return yaml.safe_dump(data, sort_keys=False).encode()


def _huge_hostlist(data: dict[str, Any]) -> bytes:
    data["rollout"]["phases"][0] = {"name": "canary", "hosts": "gpu[1-999999999]"}
    return yaml.safe_dump(data, sort_keys=False).encode()


def _subnet_false(data: dict[str, Any]) -> bytes:
    data["addressing"]["rails"][0]["subnet"] = False  # found by the fuzz test
    return yaml.safe_dump(data, sort_keys=False).encode()


def _many_phases(data: dict[str, Any]) -> bytes:
    """Planning was quadratic in phases x nodes: this took 25 s."""
    data["node_groups"][1].update(count=190_000, hostname="gpu{index:06d}")
    data["addressing"]["management"]["subnet"] = "10.0.0.0/8"
    data["addressing"]["bmc"]["subnet"] = "11.0.0.0/8"
    for i, rail in enumerate(data["addressing"]["rails"]):
        rail["subnet"] = f"{20 + i}.0.0.0/8"
    data["layout"].update(racks_per_su=256, nodes_per_rack=16, rack_power_kw=1000)
    data["rollout"]["phases"] = [{"name": f"p{i}", "count": 1} for i in range(900)]
    data["rollout"]["phases"].append({"name": "rest", "rest": True})
    return yaml.safe_dump(data, default_flow_style=True, width=10**6).encode()


CASES: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "latin1 comment": (lambda _d: _latin1_comment(), "not UTF-8"),
    "random bytes": (lambda _d: bytes(range(256)) * 8, "not UTF-8"),
    "control characters": (lambda _d: b"name: \x01\x02\n", "not allowed"),
    "recursive alias": (lambda _d: b"a: &a [*a]\n", "recursive alias *a"),
    "recursive mapping alias": (lambda _d: b"a: &a {b: *a}\n", "recursive alias *a"),
    "alias bomb": (lambda _d: _alias_bomb(9).encode(), "more than 10000 YAML nodes"),
    "bigger alias bomb": (lambda _d: _alias_bomb(12).encode(), "more than 10000 YAML nodes"),
    "deep nesting": (lambda _d: _deep(5000), "nested deeper than"),
    "deep block nesting": (
        lambda _d: "".join(f"{' ' * i}k{i}:\n" for i in range(300)).encode(),
        "nested deeper than",
    ),
    "33 MB json": (lambda _d: b'{"name": "' + b"x" * (33 << 20) + b'"}', "larger than"),
    "huge hostname width": (_huge_width, "wider than a DNS label"),
    "width from the index": (_nested_width, "may not hold a field"),
    "item of the index": (_indexed_field, "only {index} may be formatted, not {index[0]}"),
    "huge phase hostlist": (_huge_hostlist, "999999999 nodes, more than 200000"),
    "python tag": (lambda _d: b"name: !!python/object:os.system [ls]\n", "not valid YAML"),
    "unhashable key": (lambda _d: b"? [a, b]\n: c\n", "not valid YAML"),
    "empty tagged int": (lambda _d: b"name: !!int\n", "not valid YAML"),
    "subnet as a boolean": (_subnet_false, "False is not an address"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_spec_is_refused_fast_and_small(
    case: str, tmp_path: Path, lab_data: dict[str, Any]
) -> None:
    make, expected = CASES[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(make(lab_data))
    tracemalloc.start()
    start = time.process_time()  # CPU seconds: a loaded machine's wait is not ours
    try:
        with pytest.raises(SpecError) as caught:
            load_spec(spec)
        elapsed = time.process_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert expected in message
    assert message.startswith(f"{spec}"), message
    assert "\n" not in message and len(message) < 500, message
    assert elapsed < 1.0, f"{case}: {elapsed:.2f} CPU-s"
    assert peak < 200 << 20, f"{case}: {peak >> 20} MB"


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(_latin1_comment())
    lines = LAB.read_text().count("\n") + 1
    with pytest.raises(SpecError, match=rf"^{spec}:{lines}: \(top level\): not UTF-8: byte 0xe9"):
        load_spec(spec)


@pytest.mark.parametrize("case", ["random bytes", "recursive alias", "alias bomb", "deep nesting"])
def test_cli_exits_2_without_traceback(case: str, tmp_path: Path, lab_data: dict[str, Any]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(CASES[case][0](lab_data))
    result = CliRunner().invoke(main, ["topology", "check", str(spec)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith(f"error: {spec}"), result.output
    assert result.output.count("\n") == 1


def test_many_problems_are_counted_not_listed(lab_data: dict[str, Any], tmp_path: Path) -> None:
    lab_data["rollout"]["phases"] = [{"name": f"p{i}", "hosts": "nosuch[1-2]"} for i in range(200)]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(lab_data))
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    message = str(caught.value)
    assert "... and " in message
    assert message.count("\n") <= 52


@pytest.mark.parametrize(
    ("expr", "size"),
    [("gpu[01-04]", 4), ("a[1-3],b[1-2]", 5), ("x[1-2,5]y[1-3]", 9), ("n1", 1), ("", 0)],
)
def test_hostlist_size_matches_expansion(expr: str, size: int) -> None:
    assert hostlist_size(expr) == size


def test_many_phases_over_many_nodes_plan_in_linear_time(lab_data: dict[str, Any]) -> None:
    text = _many_phases(lab_data).decode()
    # CPU seconds of this process, not wall time: a loaded machine stretches the wall clock, not
    # the work (the quadratic version took 25 s of CPU).
    started = time.process_time()
    with pytest.raises(SpecError, match="needs 4096 on each rail leaf"):
        parse_spec(text, "spec.yaml")
    assert time.process_time() - started < 4


def test_too_many_phases_are_refused(lab_data: dict[str, Any]) -> None:
    lab_data["rollout"]["phases"] = [{"name": f"p{i}", "count": 1} for i in range(1001)]
    with pytest.raises(SpecError, match="1001 phases, more than 1000"):
        parse_spec(yaml.safe_dump(lab_data, default_flow_style=True, width=10**6), "spec.yaml")
