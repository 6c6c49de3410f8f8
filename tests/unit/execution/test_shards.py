from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.execution import shards
from gpuforge.inventory.reader import InventoryDir, list_inventory, read_generated_hosts


def test_split_one_shard_per_su_in_first_seen_order() -> None:
    su = {"a1": "su_01", "a2": "su_01", "b1": "su_02", "b2": "su_02"}
    got = shards.split(["b1", "a1", "b2", "a2", "x"], su)
    assert got == [
        shards.Shard("su_02", ("b1", "b2")),
        shards.Shard("su_01", ("a1", "a2")),
        shards.Shard(shards.NO_SU, ("x",)),
    ]


def test_split_cuts_an_su_to_max_hosts() -> None:
    su = dict.fromkeys(["n1", "n2", "n3", "n4", "n5"], "su_01")
    got = shards.split(["n1", "n2", "n3", "n4", "n5"], su, max_hosts=2)
    assert [(s.key, s.hosts) for s in got] == [
        ("su_01.1", ("n1", "n2")),
        ("su_01.2", ("n3", "n4")),
        ("su_01.3", ("n5",)),
    ]


def test_split_drops_duplicate_hosts() -> None:
    assert shards.split(["n1", "n1"], {}) == [shards.Shard(shards.NO_SU, ("n1",))]


def test_split_refuses_a_size_below_one() -> None:
    with pytest.raises(InputError, match="at least 1"):
        shards.split(["n1"], {}, max_hosts=0)


def test_sample_su_and_infra_come_from_the_generated_groups(cluster: Path) -> None:
    generated = read_generated_hosts(cluster)
    assert shards.infra_hosts(generated) == ["ctl01"]
    assert shards.su_of(generated)["gpu05"] == "su_01"


def test_shard_inventory_holds_only_its_hosts_and_the_infrastructure(
    cluster: Path, tmp_path: Path
) -> None:
    inv = InventoryDir.open(cluster)
    generated = read_generated_hosts(inv)
    sources = shards.write_shard_inventory(inv, generated, ["gpu02", "gpu03"], tmp_path / "s")
    assert sources == [tmp_path / "s" / "generated", tmp_path / "s" / "site"]
    listed = list_inventory(InventoryDir(tmp_path / "s"))
    assert sorted(listed["_meta"]["hostvars"]) == ["ctl01", "gpu02", "gpu03"]
    assert listed["gpu_nodes"]["hosts"] == ["gpu02", "gpu03"]
    # Variables of both layers still resolve: generated (address) and site (connection).
    gpu02 = listed["_meta"]["hostvars"]["gpu02"]
    assert gpu02["gpuforge_mgmt_address"] == generated.hostvars["gpu02"]["gpuforge_mgmt_address"]
    assert gpu02["ansible_connection"] == "local"
    # What the roles read beside the inventory goes along.
    assert (tmp_path / "s" / "generated" / "slurm" / "nodes.conf").is_file()


def test_shard_inventory_refuses_an_unknown_host(cluster: Path, tmp_path: Path) -> None:
    inv = InventoryDir.open(cluster)
    with pytest.raises(InputError, match="no host nope"):
        shards.write_shard_inventory(inv, read_generated_hosts(inv), ["nope"], tmp_path / "s")
