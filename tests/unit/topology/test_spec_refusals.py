"""Specs the hostile-input probe found accepted (issue 33, item 11) are refused at load.

One parametrized test per class of spec; each case asserts the field path, the reason, a line,
and that ``gpuforge topology check`` exits 2 with ``FILE:LINE: field: reason`` and no traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.topology import SpecError, load_cluster, load_spec

Data = dict[str, Any]
Case = tuple[str, Callable[[Data], None], str, str]


def _set(*path: str | int, value: object) -> Callable[[Data], None]:
    """A mutation setting ``data[path[0]]...[path[-1]] = value``."""

    def mutate(data: Data) -> None:
        node: Any = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _both(*mutations: Callable[[Data], None]) -> Callable[[Data], None]:
    def mutate(data: Data) -> None:
        for one in mutations:
            one(data)

    return mutate


GPU = ("node_types", "h100-sxm")
SERVICE = ("node_types", "service")


def _refused(
    data: Data, write_spec: Callable[[Data], Path], mutate: Callable[[Data], None]
) -> tuple[Path, SpecError]:
    mutate(data)
    path = write_spec(data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return path, err.value


def _assert_names(path: Path, err: SpecError, field: str, reason: str) -> None:
    problems = {p.path: p for p in err.problems}
    assert field in problems, str(err)
    problem = problems[field]
    assert reason in problem.message, problem.message
    assert problem.line is not None
    assert f"{path}:{problem.line}: {field}: " in str(err)
    assert err.exit_code == 2


def _assert_cli_refuses(path: Path, field: str) -> None:
    result = CliRunner().invoke(main, ["topology", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}:" in result.output
    assert f": {field}: " in result.output
    assert "Traceback" not in result.output


PINS: list[Case] = [
    ("newline", _set("versions", "nvidia_driver", value="570.133.20\n"), "nvidia_driver", ""),
    ("leading-space", _set("versions", "cuda", value=" 12.8.1"), "cuda", ""),
    ("trailing-space", _set("versions", "nccl", value="2.26.2 "), "nccl", ""),
    ("tab", _set("versions", "slurm", value="22.05.8\t"), "slurm", ""),
    ("inner-newline", _set("versions", "dcgm", value="4.2\n.3"), "dcgm", ""),
    ("doca-newline", _set("versions", "doca_ofed", value="2.9.1\n"), "doca_ofed", ""),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:3] for c in PINS], ids=[c[0] for c in PINS])
def test_pin_with_whitespace_is_refused(
    lab_data: Data, write_spec: Callable[[Data], Path], mutate: Callable[[Data], None], field: str
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, f"versions.{field}", "is not a version")
    _assert_cli_refuses(path, f"versions.{field}")


def test_other_text_fields_refuse_a_trailing_newline(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    """``re.match`` with ``$`` takes a final newline: the model's checks match whole values."""
    lab_data["domain"] = "lab.gpuforge.test\n"
    lab_data["monitoring"] = {
        "retention": "15d\n",
        "remote_write": [{"name": "lt", "url": "http://x\n"}],
    }
    path = write_spec(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert {p.path for p in err.value.problems} >= {
        "domain",
        "monitoring.retention",
        "monitoring.remote_write[0].url",
    }


NAMES: list[Case] = [
    (
        "controller-is-a-bmc-name",
        _set("node_groups", 0, "hostname", value="gpu{index:02d}-bmc"),
        "node_groups[0].hostname",
        "hostname gpu01-bmc is also the BMC name of node gpu01 (group 'gpu')",
    ),
    (
        "bmc-name-longer-than-a-label",
        _both(  # names of 60 characters: gg...g1000 to gg...g1007
            _set("node_groups", 1, "hostname", value="g" * 56 + "{index}"),
            _set("node_groups", 1, "first_index", value=1000),
        ),
        "node_groups[1].hostname",
        "-bmc is longer than a DNS label (63)",
    ),
    (
        "fqdn-over-253",
        _both(
            _set("domain", value=".".join(["a" * 63] * 3 + ["a" * 50])),
            _set("node_groups", 1, "hostname", value="gpunode{index:02d}"),
        ),
        "node_groups[1].hostname",
        "is 256 characters, more than 253",
    ),
    (
        "domain-over-253",
        _set("domain", value=".".join(["a" * 60] * 5)),
        "domain",
        "304 characters",
    ),
    (
        "domain-label-over-63",
        _set("domain", value="a" * 64 + ".test"),
        "domain",
        "is not a lower-case DNS domain",
    ),
    (
        "hostname-label-over-63",
        _set("node_groups", 1, "hostname", value="g" * 62 + "{index:02d}"),
        "node_groups[1].hostname",
        "longer than a DNS label",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "reason"), [c[1:] for c in NAMES], ids=[c[0] for c in NAMES]
)
def test_colliding_or_overlong_names_are_refused(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    mutate: Callable[[Data], None],
    field: str,
    reason: str,
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, field, reason)
    _assert_cli_refuses(path, field)


def test_a_name_that_only_looks_like_a_bmc_name_is_taken(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    lab_data["node_groups"][0]["hostname"] = "ctl{index:02d}-bmc"  # ctl01 is no node
    cluster = load_cluster(write_spec(lab_data))
    assert cluster.nodes[0].hostname == "ctl01-bmc"


NICS: list[Case] = [
    (
        "rail-netdev-is-the-management-nic",
        _set(*GPU, "rails", 0, "netdev", value="eno1"),
        "node_types.h100-sxm.rails[0].netdev",
        "eno1 is also management_nic",
    ),
    (
        "storage-nic-is-a-rail-device",
        _set(*GPU, "storage_nics", value=["mlx5_8", "mlx5_0"]),
        "node_types.h100-sxm.storage_nics[1]",
        "mlx5_0 is also rails[0].device",
    ),
    (
        "storage-nic-is-a-rail-netdev",
        _set(*GPU, "storage_nics", value=["ib3"]),
        "node_types.h100-sxm.storage_nics[0]",
        "ib3 is also rails[3].netdev",
    ),
    (
        "storage-nic-is-the-management-nic",
        _set(*SERVICE, "storage_nics", value=["eno1"]),
        "node_types.service.storage_nics[0]",
        "eno1 is also management_nic",
    ),
    (
        "storage-nics-repeat",
        _set(*GPU, "storage_nics", value=["mlx5_8", "mlx5_8"]),
        "node_types.h100-sxm.storage_nics[1]",
        "mlx5_8 is also storage_nics[0]",
    ),
    (
        "rails-share-a-netdev",
        _set(*GPU, "rails", 1, "netdev", value="ib0"),
        "node_types.h100-sxm.rails",
        "duplicate netdev among the rails",
    ),
    (
        "rails-share-a-device",
        _set(*GPU, "rails", 1, "device", value="mlx5_0"),
        "node_types.h100-sxm.rails",
        "duplicate device among the rails",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "reason"), [c[1:] for c in NICS], ids=[c[0] for c in NICS]
)
def test_one_interface_in_two_roles_is_refused(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    mutate: Callable[[Data], None],
    field: str,
    reason: str,
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, field, reason)
    _assert_cli_refuses(path, field)


BOUNDS: list[Case] = [
    ("memory-2^64", _set(*GPU, "memory_mb", value=2**64), "node_types.h100-sxm.memory_mb", ""),
    (
        "memory-2^40+1",
        _set(*GPU, "memory_mb", value=2**40 + 1),
        "node_types.h100-sxm.memory_mb",
        "",
    ),
    (
        "first-index-10^20",
        _set("node_groups", 1, "first_index", value=10**20),
        "node_groups[1].first_index",
        "less than or equal to 999999999",
    ),
    (
        "last-index-over-nine-digits",
        _set("node_groups", 1, "first_index", value=999_999_995),
        "node_groups[1].first_index",
        "last index 1000000002 is above 999999999",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "reason"), [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS]
)
def test_integers_beyond_slurm_and_hostlist_are_refused(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    mutate: Callable[[Data], None],
    field: str,
    reason: str,
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, field, reason or "less than or equal to 1099511627776")
    _assert_cli_refuses(path, field)


def test_largest_index_is_taken(lab_data: Data, write_spec: Callable[[Data], Path]) -> None:
    lab_data["node_groups"][1].update(first_index=999_999_992, hostname="gpu{index}")
    lab_data["node_types"]["h100-sxm"]["memory_mb"] = 2**40
    cluster = load_cluster(write_spec(lab_data))
    assert cluster.nodes[-1].hostname == "gpu999999999"


RANGES: list[tuple[str, str, str]] = [
    ("management", "224.0.0.0/24", "multicast (224.0.0.0/4)"),
    ("bmc", "240.0.0.0/24", "reserved (240.0.0.0/4"),
    ("bmc", "255.255.255.0/24", "reserved (240.0.0.0/4"),
    ("rails[0]", "127.0.0.0/24", "loopback (127.0.0.0/8)"),
    ("rails[1]", "169.254.0.0/24", "link-local (169.254.0.0/16)"),
    ("rails[2]", "0.0.0.0/24", "'this network' (0.0.0.0/8)"),
    ("management", "0.0.0.0/0", "'this network' (0.0.0.0/8)"),
]


@pytest.mark.parametrize(("where", "subnet", "reason"), RANGES, ids=[r[1] for r in RANGES])
def test_special_ranges_are_refused_for_every_subnet(
    lab_data: Data, write_spec: Callable[[Data], Path], where: str, subnet: str, reason: str
) -> None:
    addressing = lab_data["addressing"]
    if where.startswith("rails["):
        entry = addressing["rails"][int(where[6:-1])]
    else:
        entry = addressing[where]
    entry.clear()
    entry["subnet"] = subnet
    path = write_spec(lab_data)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    field = f"addressing.{where}.subnet"
    _assert_names(path, err.value, field, f"{subnet} overlaps the {reason}")
    _assert_cli_refuses(path, field)


FLOATS: list[Case] = [
    (
        "rack-power-inf",
        _set("layout", "rack_power_kw", value=float("inf")),
        "layout.rack_power_kw",
        "",
    ),
    (
        "rack-power-nan",
        _set("layout", "rack_power_kw", value=float("nan")),
        "layout.rack_power_kw",
        "",
    ),
    (
        "node-power-nan",
        _set(*GPU, "power_kw", value=float("nan")),
        "node_types.h100-sxm.power_kw",
        "",
    ),
    (
        "oversubscription-inf",
        _set("fabric", "oversubscription", value=float("inf")),
        "fabric.oversubscription",
        "",
    ),
    (
        "gate-nan",
        _set("rollout", "phases", 0, "min_pass_fraction", value=float("nan")),
        "rollout.phases[0].min_pass_fraction",
        "",
    ),
    (
        "upgrade-fraction-nan",
        _set("upgrade", value={"max_fraction": float("nan")}),
        "upgrade.max_fraction",
        "",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:3] for c in FLOATS], ids=[c[0] for c in FLOATS])
def test_non_finite_floats_are_refused(
    lab_data: Data, write_spec: Callable[[Data], Path], mutate: Callable[[Data], None], field: str
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, field, "finite number")
    _assert_cli_refuses(path, field)


def test_topology_json_is_strict_json(
    tmp_path: Path, write_spec: Callable[[Data], Path], lab_data: Data
) -> None:
    out = tmp_path / "inv"
    result = CliRunner().invoke(
        main, ["inventory", "generate", str(write_spec(lab_data)), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    (topology_json,) = out.rglob("topology.json")

    def refuse(token: str) -> None:
        raise AssertionError(f"non-JSON token {token}")

    json.loads(topology_json.read_text(), parse_constant=refuse)


NVLINK: list[Case] = [
    (
        "nvswitch-without-domain",
        _set(*GPU, "nvlink_domain", value=0),
        "node_types.h100-sxm.nvlink_domain",
        "0 with NVSwitch: give the GPUs of one NVLink domain (at least the node's 8",
    ),
    (
        "nvswitch-without-gpus",
        _set(*SERVICE, "nvswitch", value=True),
        "node_types.service.nvswitch",
        "NVSwitch on a node type without GPUs",
    ),
    (
        "domain-without-gpus",
        _set(*SERVICE, "nvlink_domain", value=8),
        "node_types.service.nvlink_domain",
        "an NVLink domain on a node type without GPUs",
    ),
    (
        "domain-larger-than-the-group",
        _set(*GPU, "nvlink_domain", value=128),
        "node_groups[1].count",
        "8 nodes leave a partial NVLink domain of 16 nodes",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "reason"), [c[1:] for c in NVLINK], ids=[c[0] for c in NVLINK]
)
def test_impossible_nvlink_domains_are_refused(
    lab_data: Data,
    write_spec: Callable[[Data], Path],
    mutate: Callable[[Data], None],
    field: str,
    reason: str,
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, field, reason)
    _assert_cli_refuses(path, field)


IFNAMES: list[Case] = [
    ("storage-shell", _set(*GPU, "storage_nics", value=["eth0; reboot"]), "storage_nics[0]", ""),
    ("storage-16-chars", _set(*GPU, "storage_nics", value=["e" * 16]), "storage_nics[0]", ""),
    ("management-space", _set(*GPU, "management_nic", value="eno1 "), "management_nic", ""),
    ("management-dotdot", _set(*GPU, "management_nic", value=".."), "management_nic", ""),
    ("netdev-slash", _set(*GPU, "rails", 0, "netdev", value="ib/0"), "rails[0].netdev", ""),
    ("netdev-colon", _set(*GPU, "rails", 0, "netdev", value="ib0:1"), "rails[0].netdev", ""),
    ("netdev-dot", _set(*GPU, "rails", 0, "netdev", value="."), "rails[0].netdev", ""),
    ("netdev-newline", _set(*GPU, "rails", 0, "netdev", value="ib0\n"), "rails[0].netdev", ""),
    ("device-64-chars", _set(*GPU, "rails", 0, "device", value="m" * 64), "rails[0].device", ""),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [c[1:3] for c in IFNAMES], ids=[c[0] for c in IFNAMES]
)
def test_invalid_interface_names_are_refused(
    lab_data: Data, write_spec: Callable[[Data], Path], mutate: Callable[[Data], None], field: str
) -> None:
    path, err = _refused(lab_data, write_spec, mutate)
    _assert_names(path, err, f"node_types.h100-sxm.{field}", "should match pattern")
    _assert_cli_refuses(path, f"node_types.h100-sxm.{field}")
