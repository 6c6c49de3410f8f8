"""The generated inventory: contract, Slurm files, determinism, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import hostlist
import pytest
import yaml

from gpuforge.errors import InputError, OperationError
from gpuforge.generate import render_files, write_inventory
from gpuforge.inventory import render
from gpuforge.slurm.conf import nodes_conf, topology_conf
from gpuforge.topology import Cluster, load_cluster

from ..conftest import EXAMPLES, LAB


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return load_cluster(LAB)


@pytest.fixture(scope="module")
def c10k() -> Cluster:
    return load_cluster(EXAMPLES / "cluster-10k.yaml")


def _read_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_lab_inventory_files(lab: Cluster, tmp_path: Path) -> None:
    written = write_inventory(lab, tmp_path / "inv")
    names = sorted(str(p.relative_to(tmp_path / "inv")) for p in written)
    assert names == [
        ".gpuforge-generated",
        "group_vars/all.yml",
        "group_vars/monitoring.yml",
        "group_vars/nodetype_h100_sxm.yml",
        "group_vars/nodetype_service.yml",
        "group_vars/phase_01.yml",
        "group_vars/phase_02.yml",
        "hosts",
        "hosts.yml",
        "monitoring/file_sd/dcgm.json",
        "monitoring/file_sd/node.json",
        "monitoring/prometheus/ctl01.yml",
        "monitoring/rules/gpuforge-records.yml",
        "slurm/nodes.conf",
        "slurm/topology.conf",
        "topology.json",
    ]
    assert sorted(_read_tree(tmp_path / "inv")) == names


def _members(group: dict[str, Any]) -> list[str]:
    """Expand the Ansible ranges of a group (``gpu[01:04]``) with python-hostlist."""
    return [
        h for pattern in group["hosts"] for h in hostlist.expand_hostlist(pattern.replace(":", "-"))
    ]


def test_ansible_ranges() -> None:
    names = ["gpu01", "gpu02", "gpu03", "gpu05", "ctl01", "gpu9", "gpu10", "gpu11", "x", "a-1"]
    assert render.ansible_ranges(names) == [
        "gpu[01:03]",
        "gpu05",
        "ctl01",
        "gpu9",
        "gpu[10:11]",
        "x",
        "a-1",
    ]


def test_ansible_ranges_of_random_lists_expand_back_to_them() -> None:
    """One run of numbers in one width is one pattern; any list's patterns give it back."""
    rng = random.Random(31)
    for _ in range(2000):
        prefix = rng.choice(["gpu", "node-", "c", "", "r1n", "svc", "a9"])
        width = rng.choice([1, 2, 3, 5])
        start = rng.randrange(0, 10**width)
        numbers = list(range(start, start + rng.randrange(1, 40)))
        run = all(len(str(n)) <= width for n in numbers)
        if rng.random() < 0.3:
            numbers = sorted(rng.sample(numbers, max(1, len(numbers) // 2)))
            run = False
        hosts = [f"{prefix}{n:0{width}d}" for n in numbers]
        ranges = render.ansible_ranges(hosts)
        assert _members({"hosts": ranges}) == hosts, hosts
        if len(hosts) == 1 or (run and prefix and not prefix[-1].isdigit()):
            assert len(ranges) == 1, (hosts, ranges)


def test_hosts_yml_groups_and_minimal_host_vars(lab: Cluster) -> None:
    data = yaml.safe_load(render_files(lab)["hosts.yml"])["all"]
    children = data["children"]
    assert _members(children["slurm_controllers"]) == ["ctl01"]
    assert children["gpu_nodes"] == {"hosts": {"gpu[01:08]": None}}
    assert children["login"] == {} and children["storage"] == {}
    assert _members(children["phase_01"]) == ["ctl01", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert _members(children["rack_r002"]) == ["gpu05", "gpu06", "gpu07", "gpu08"]
    assert len(_members(children["su_01"])) == 8
    assert _members(children["nodetype_h100_sxm"]) == [f"gpu{i:02d}" for i in range(1, 9)]
    assert data["hosts"]["ctl01"] == {"gpuforge_mgmt_address": "10.231.0.10"}
    gpu08 = data["hosts"]["gpu08"]
    assert set(gpu08) == {"gpuforge_mgmt_address", "gpuforge_rail_addresses"}
    assert gpu08["gpuforge_rail_addresses"][0] == "10.100.0.18/24"


def test_group_vars_carry_the_pins(lab: Cluster) -> None:
    files = render_files(lab)
    pins = yaml.safe_load(files["group_vars/all.yml"])
    assert pins["nvidia_driver_version"] == "570.133.20"
    assert pins["cuda_toolkit_version"] == "12.8.1"
    assert pins["nccl_version"] == "2.26.2"
    assert pins["dcgm_version"] == "4.2.3"
    assert pins["slurm_version"] == "22.05.8"
    assert pins["doca_ofed_version"] == "2.9.1"
    assert pins["fabric_kind"] == "infiniband" and pins["fabric_rate_gbps"] == 400
    assert pins["fabric_rail_subnets"][7] == "10.100.7.0/24"
    assert pins["slurm_topology_plugin"] == "tree"
    assert pins["slurm_controllers"] == ["ctl01"]
    node_type = yaml.safe_load(files["group_vars/nodetype_h100_sxm.yml"])["gpu_node_type"]
    assert node_type["gpus"] == 8 and node_type["nvswitch"] is True
    assert node_type["rails"][3] == {
        "rail": 3,
        "device": "mlx5_3",
        "netdev": "ib3",
        "rate_gbps": 400,
    }
    gate = yaml.safe_load(files["group_vars/phase_02.yml"])
    assert gate == {
        "gpuforge_phase": 2,
        "gpuforge_phase_name": "wave1",
        "gpuforge_phase_min_pass_fraction": 0.75,
    }


def test_hosts_yml_carries_no_connection_settings(lab: Cluster) -> None:
    hosts = yaml.safe_load(render.hosts_yml(lab))["all"]["hosts"]
    assert not [k for values in hosts.values() for k in values if k.startswith("ansible_")]


def test_lab_nodes_conf(lab: Cluster) -> None:
    assert nodes_conf(lab).splitlines()[3:] == [
        "NodeName=gpu[01-04] CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 "
        "RealMemory=2063937 Gres=gpu:h100:8 Features=su01,r001 State=UNKNOWN",
        "NodeName=gpu[05-08] CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 "
        "RealMemory=2063937 Gres=gpu:h100:8 Features=su01,r002 State=UNKNOWN",
        "PartitionName=gpu Nodes=gpu[01-08] Default=YES MaxTime=INFINITE State=UP",
    ]


def test_lab_topology_conf(lab: Cluster) -> None:
    lines = [ln for ln in topology_conf(lab).splitlines() if not ln.startswith("#")]
    assert lines == ["SwitchName=leaf-su01 Nodes=gpu[01-08]", "SwitchName=spine Switches=leaf-su01"]


def _switch_lines(text: str) -> dict[str, dict[str, str]]:
    result = {}
    for line in text.splitlines():
        if line.startswith(("SwitchName=", "BlockName=")):
            fields = dict(part.split("=", 1) for part in line.split())
            name = fields.pop("SwitchName", None) or fields.pop("BlockName")
            result[name] = fields
    return result


def test_10k_topology_conf_puts_every_gpu_node_under_one_leaf_switch(c10k: Cluster) -> None:
    switches = _switch_lines(topology_conf(c10k))
    lowest = {name: f for name, f in switches.items() if "Nodes" in f}
    members = [h for f in lowest.values() for h in hostlist.expand_hostlist(f["Nodes"])]
    gpu = [n.hostname for n in c10k.gpu_nodes]
    assert sorted(members) == sorted(gpu)  # every GPU node exactly once
    # Rail-optimized: one lowest-level switch per SU (the SU's 8 rail leaves), 63 of them.
    assert len(lowest) == 63
    for name, fields in lowest.items():
        nodes = [c10k.node(h) for h in hostlist.expand_hostlist(fields["Nodes"])]
        assert {n.su for n in nodes} == {int(name.removeprefix("leaf-su"))}
        assert len({tuple(p.leaf for p in n.rails) for n in nodes}) == 1
    # Three tiers: pods of 20 SUs, then one core switch over the 4 pods.
    pods = {n: f for n, f in switches.items() if n.startswith("spine-p")}
    assert sorted(pods) == ["spine-p01", "spine-p02", "spine-p03", "spine-p04"]
    under_pods = [s for f in pods.values() for s in hostlist.expand_hostlist(f["Switches"])]
    assert sorted(under_pods) == sorted(lowest)
    assert hostlist.expand_hostlist(switches["core"]["Switches"]) == sorted(pods)


def test_10k_nodes_conf_covers_every_gpu_node_once(c10k: Cluster) -> None:
    text = nodes_conf(c10k)
    node_lines = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    members = [h for ln in node_lines for h in hostlist.expand_hostlist(ln.split()[0][9:])]
    assert members == [n.hostname for n in c10k.gpu_nodes]
    assert len(node_lines) == 313  # one per rack
    assert all("Gres=gpu:h100:8" in ln for ln in node_lines)
    partition = next(ln for ln in text.splitlines() if ln.startswith("PartitionName=gpu "))
    assert "Nodes=gpu[00001-01250] " in partition


def test_nvl72_block_topology() -> None:
    cluster = load_cluster(EXAMPLES / "nvl72.yaml")
    text = topology_conf(cluster)
    blocks = _switch_lines(text)
    assert len(blocks) == 16
    assert blocks["nvl001"] == {"Nodes": "gb[0001-0018]"}
    assert "BlockSizes=18,36,72,144,288\n" in text
    assert "SwitchName" not in text


def test_topology_json_is_the_expanded_model(lab: Cluster) -> None:
    data: dict[str, Any] = json.loads(render_files(lab)["topology.json"])
    assert data["name"] == "lab" and data["fabric"]["tiers"] == 2
    assert [n["hostname"] for n in data["nodes"]][:2] == ["ctl01", "gpu01"]
    rails = dict(zip(data["rail_fields"], data["nodes"][1]["rails"][0], strict=True))
    assert rails == {
        "rail": 0,
        "device": "mlx5_0",
        "netdev": "ib0",
        "address": "10.100.0.11/24",
        "leaf": "leaf-su01-r0",
        "port": 1,
    }
    assert len(data["links"]) == len(lab.links)
    assert data["phases"][0]["hosts"] == "gpu[01-04]"


def test_etc_hosts_fragment(lab: Cluster) -> None:
    lines = render_files(lab)["hosts"].splitlines()
    assert "10.231.0.11\tgpu01.lab.gpuforge.test\tgpu01" in lines
    assert "10.231.1.10\tctl01-bmc.lab.gpuforge.test\tctl01-bmc" in lines


def test_output_is_byte_identical(tmp_path: Path) -> None:
    write_inventory(load_cluster(EXAMPLES / "superpod-4su.yaml"), tmp_path / "a")
    write_inventory(load_cluster(EXAMPLES / "superpod-4su.yaml"), tmp_path / "b")
    assert _read_tree(tmp_path / "a") == _read_tree(tmp_path / "b")


def test_rewrite_replaces_the_directory_and_leaves_no_temp(lab: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "inv"
    write_inventory(lab, out)
    (out / "stale.yml").write_text("old: true\n")
    write_inventory(lab, out)
    assert not (out / "stale.yml").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]


def test_failed_write_leaves_the_old_inventory(
    lab: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "inv"
    write_inventory(lab, out)
    before = _read_tree(out)
    real_write = Path.write_text
    calls = {"n": 0}

    def failing_write(self: Path, *args: Any, **kwargs: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing_write)
    with pytest.raises(OperationError, match="No space left"):
        write_inventory(lab, out)
    assert _read_tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]


def test_group_names_are_ansible_safe(lab: Cluster) -> None:
    names = render.groups(lab)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names)


def test_a_directory_gpuforge_did_not_write_is_never_replaced(lab: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "inv"
    out.mkdir()
    (out / "mine.txt").write_text("keep me\n")
    with pytest.raises(InputError, match="gpuforge did not write it"):
        write_inventory(lab, out)
    assert _read_tree(out) == {"mine.txt": b"keep me\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv"]


def test_an_empty_directory_is_written(lab: Cluster, tmp_path: Path) -> None:
    (tmp_path / "inv").mkdir()
    write_inventory(lab, tmp_path / "inv")
    assert (tmp_path / "inv" / ".gpuforge-generated").is_file()


def test_a_directory_holding_the_spec_is_never_replaced(lab: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "inv"
    write_inventory(lab, out)
    spec = out / "lab.yaml"
    spec.write_text(LAB.read_text())
    with pytest.raises(InputError, match="holds the input"):
        write_inventory(lab, out, protect=(spec,))
    assert spec.read_text() == LAB.read_text()


@pytest.mark.parametrize("spec", ["lab.yaml", "superpod-4su.yaml", "cluster-10k.yaml"])
def test_topology_json_is_what_the_json_encoder_writes(spec: str) -> None:
    """The links' fast rows change no byte of topology.json."""
    cluster = load_cluster(EXAMPLES / spec)
    text = json.dumps(render.topology_json(cluster), separators=(",", ":"), sort_keys=True)
    assert render.topology_json_text(cluster) == text + "\n"


def test_topology_json_escapes_a_name_json_must_escape(lab: Cluster) -> None:
    """A name outside the plain characters (no spec allows one today) takes the encoder."""
    odd_node = dataclasses.replace(lab.nodes[0], hostname='gpu"01')
    odd = dataclasses.replace(lab, nodes=(odd_node, *lab.nodes[1:]))
    text = render.topology_json_text(odd)
    assert json.loads(text)["nodes"][0]["hostname"] == 'gpu"01'
    expected = json.dumps(render.topology_json(odd), separators=(",", ":"), sort_keys=True)
    assert text == expected + "\n"


@pytest.mark.parametrize("spec", ["lab.yaml", "superpod-4su.yaml", "cluster-10k.yaml"])
def test_hosts_yml_is_the_generic_writer_s(spec: str) -> None:
    """The cluster's hosts.yml, formatted directly, is what hosts_yml_text writes of its hosts."""
    cluster = load_cluster(EXAMPLES / spec)
    hostvars = {n.hostname: render.host_vars(n) for n in cluster.nodes}
    assert render.hosts_yml(cluster) == render.hosts_yml_text(hostvars, render.groups(cluster))
