"""Every invalid spec the issue lists gets an error naming file, field path and line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.topology import SpecError, load_spec, parse_spec

Data = dict[str, Any]


def _gpu_group(d: Data) -> Data:
    group: Data = d["node_groups"][1]
    return group


def unknown_field(d: Data) -> None:
    d["fabric"]["colour"] = "blue"


def missing_field(d: Data) -> None:
    del d["fabric"]["radix"]


def duplicate_hostnames(d: Data) -> None:
    d["node_groups"].append(
        {
            "name": "more",
            "role": "gpu",
            "count": 1,
            "hostname": "gpu{index:02d}",
            "node_type": "h100-sxm",
            "first_index": 8,
        }
    )


def subnet_too_small(d: Data) -> None:
    d["addressing"]["rails"][3]["subnet"] = "10.100.3.0/29"


def subnets_overlap(d: Data) -> None:
    d["addressing"]["rails"][1]["subnet"] = "10.100.0.0/23"


def radix_too_small_for_su(d: Data) -> None:
    d["fabric"]["radix"] = 8  # 4 node ports per leaf, an SU of 8 nodes


def too_many_endpoints(d: Data) -> None:
    d["fabric"]["radix"] = 4
    d["layout"]["racks_per_su"] = 1
    d["layout"]["nodes_per_rack"] = 1
    _gpu_group(d)["count"] = 20
    d["addressing"]["management"]["subnet"] = "10.231.0.0/24"


def racks_too_few(d: Data) -> None:
    d["layout"]["racks"] = 1


def rack_power(d: Data) -> None:
    d["layout"]["rack_power_kw"] = 30


def rails_do_not_match_nics(d: Data) -> None:
    d["node_types"]["h100-sxm"]["rails"].pop()


def rail_subnets_do_not_match(d: Data) -> None:
    d["addressing"]["rails"].pop()


def phases_overlap(d: Data) -> None:
    d["rollout"]["phases"] = [
        {"name": "canary", "hosts": "gpu[01-04]"},
        {"name": "wave", "hosts": "gpu[04-08]"},
    ]


def phases_leave_nodes_out(d: Data) -> None:
    d["rollout"]["phases"] = [{"name": "canary", "count": 4}, {"name": "wave", "count": 3}]


def version_not_quoted(d: Data) -> None:
    d["versions"]["cuda"] = 12.8


def version_not_a_version(d: Data) -> None:
    d["versions"]["nvidia_driver"] = "latest"


def gateway_inside_nodes(d: Data) -> None:
    d["addressing"]["management"]["gateway"] = "10.231.0.12"


def unknown_node_type(d: Data) -> None:
    _gpu_group(d)["node_type"] = "h200"


def bad_hostname_pattern(d: Data) -> None:
    _gpu_group(d)["hostname"] = "GPU_{index}"


def phase_with_two_selectors(d: Data) -> None:
    d["rollout"]["phases"][0]["rest"] = True


CASES: list[tuple[Callable[[Data], None], str, str]] = [
    (unknown_field, "fabric.colour", "unknown field"),
    (missing_field, "fabric.radix", "field required"),
    (duplicate_hostnames, "node_groups[2].hostname", "duplicate hostname gpu08"),
    (subnet_too_small, "addressing.rails[3].subnet", "10.100.3.0/29 is too small: 9 nodes"),
    (subnets_overlap, "addressing.rails[1].subnet", "overlaps addressing.rails[0].subnet"),
    (radix_too_small_for_su, "fabric.radix", "SU of 8 nodes needs 8 on each rail leaf"),
    (too_many_endpoints, "fabric.radix", "20 endpoints per plane exceed the 16 that three tiers"),
    (racks_too_few, "layout.racks", "need 2 racks, only 1 available"),
    (rack_power, "layout.rack_power_kw", "drawing 40.8 kW, more than the 30 kW budget"),
    (rails_do_not_match_nics, "node_types.h100-sxm.rails", "7 compute NICs, but fabric.rails is 8"),
    (rail_subnets_do_not_match, "addressing.rails", "7 rail subnets, but fabric.rails is 8"),
    (phases_overlap, "rollout.phases[1]", "overlaps phase 'canary' on gpu04"),
    (phases_leave_nodes_out, "rollout.phases", "1 GPU nodes are in no phase: gpu08"),
    (version_not_quoted, "versions.cuda", "12.8 is not a version: write it as a quoted string"),
    (version_not_a_version, "versions.nvidia_driver", "'latest' is not a version"),
    (gateway_inside_nodes, "addressing.management.host_offset", "include the gateway 10.231.0.12"),
    (unknown_node_type, "node_groups[1].node_type", "unknown node type 'h200'"),
    (bad_hostname_pattern, "node_groups[1].hostname", "not a valid lower-case DNS label"),
    (phase_with_two_selectors, "rollout.phases[0]", "give exactly one of count, sus, hosts, rest"),
]


def _line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.mark.parametrize(("mutate", "field", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_invalid_spec_names_file_field_line(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    mutate: Callable[[Data], None],
    field: str,
    message: str,
) -> None:
    mutate(lab_data)
    path = write_spec(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    problems = {p.path: p for p in err.value.problems}
    assert field in problems, str(err.value)
    problem = problems[field]
    assert message in problem.message
    assert problem.line is not None
    assert f"{path}:{problem.line}: {field}: " in str(err.value)
    assert err.value.exit_code == 2
    assert isinstance(err.value, InputError)


def test_line_points_at_the_field(lab_data: Data, write_spec: Callable[[Data], Path]) -> None:
    lab_data["fabric"]["radix"] = 8
    path = write_spec(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.problems[0].line == _line_of(path, "radix: 8")


def test_unknown_field_line_is_the_key(lab_data: Data, write_spec: Callable[[Data], Path]) -> None:
    unknown_field(lab_data)
    path = write_spec(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.problems[0].line == _line_of(path, "colour: blue")


def test_all_problems_are_reported_at_once(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    rack_power(lab_data)
    subnets_overlap(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(lab_data))
    assert {p.path for p in err.value.problems} >= {
        "layout.rack_power_kw",
        "addressing.rails[1].subnet",
    }
    assert str(err.value).startswith("2 problems in ")


def test_duplicate_yaml_key_is_an_error() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("name: a\nname: b\n", "x.yaml")
    assert str(err.value) == "x.yaml:2: name: duplicate key"


def test_yaml_syntax_error_has_line() -> None:
    with pytest.raises(SpecError, match=r"^x.yaml:2: \(top level\): not valid YAML"):
        parse_spec("name: a\n  bad: [\n", "x.yaml")


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "nope.yaml")


def test_spec_must_be_a_mapping() -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_spec("- a\n- b\n", "x.yaml")
