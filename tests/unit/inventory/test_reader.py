"""The one inventory reader: both layers through the real ansible-inventory, site last."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.generate import write_cluster_inventory, write_inventory
from gpuforge.inventory.reader import ClusterView, InventoryDir, host_vars, list_inventory
from gpuforge.topology import load_cluster

from ..conftest import LAB


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("c") / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    (root / "site" / "group_vars" / "all" / "mirror.yml").write_text(
        "---\ngpuforge_apt_repo_url: https://mirror.site.test/\nnccl_version: 9.9.9\n"
    )
    (root / "site" / "hosts.yml").write_text(
        '{"all": {"hosts": {"gpu01": {"ansible_host": "192.0.2.1", "ansible_user": "ops"}}}}\n'
    )
    return root


def test_sources_are_generated_then_site(cluster_dir: Path) -> None:
    inv = InventoryDir.open(cluster_dir)
    assert inv.sources == (
        (cluster_dir / "generated").resolve(),
        (cluster_dir / "site").resolve(),
    )
    assert inv.ansible_args() == [
        "-i",
        str((cluster_dir / "generated").resolve()),
        "-i",
        str((cluster_dir / "site").resolve()),
    ]


def test_site_overrides_generated_for_the_same_variable(cluster_dir: Path) -> None:
    gpu01 = host_vars(cluster_dir, "gpu01")
    assert gpu01["nccl_version"] == "9.9.9"  # site beats generated/group_vars/all.yml
    assert gpu01["gpuforge_apt_repo_url"] == "https://mirror.site.test/"
    assert gpu01["ansible_host"] == "192.0.2.1"
    assert gpu01["cuda_toolkit_version"] == "12.8.1"  # the rest from the spec


def test_list_has_every_host_with_merged_variables(cluster_dir: Path) -> None:
    data = list_inventory(cluster_dir)
    hostvars: dict[str, Any] = data["_meta"]["hostvars"]
    assert sorted(hostvars) == ["ctl01"] + [f"gpu{i:02d}" for i in range(1, 9)]
    assert hostvars["gpu02"]["gpu_node_type"]["gpus"] == 8
    assert "ansible_host" not in hostvars["gpu02"]
    assert hostvars["gpu01"]["ansible_user"] == "ops"


def test_cluster_view_reads_topology_and_both_layers(cluster_dir: Path) -> None:
    view = ClusterView.load(cluster_dir)
    assert view.path == cluster_dir
    assert view.gpu_nodes == [f"gpu{i:02d}" for i in range(1, 9)]
    assert view.controller() == "ctl01"
    assert view.select(phase=2) == ["gpu05", "gpu06", "gpu07", "gpu08"]
    assert view.hostvars("gpu01")["ansible_host"] == "192.0.2.1"
    assert view.node_type("gpu03")["gpu_model"] == "H100-SXM-80GB"
    assert view.rails("gpu01")[0]["device"] == "mlx5_0"


def test_ansible_env_names_both_layers_for_tools_without_minus_i(cluster_dir: Path) -> None:
    env = InventoryDir.open(cluster_dir).ansible_env()
    assert env["ANSIBLE_INVENTORY"].split(",") == [
        str((cluster_dir / "generated").resolve()),
        str((cluster_dir / "site").resolve()),
    ]


def test_a_missing_directory_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="gpuforge inventory generate"):
        InventoryDir.open(tmp_path / "nope")


def test_the_old_single_directory_layout_is_named(tmp_path: Path) -> None:
    write_inventory(load_cluster(LAB), tmp_path / "old")
    with pytest.raises(InputError, match="old single-directory layout"):
        InventoryDir.open(tmp_path / "old")


def test_an_unknown_host_is_bad_input(cluster_dir: Path) -> None:
    with pytest.raises(InputError, match="gpu99"):
        host_vars(cluster_dir, "gpu99")


def test_a_view_without_site_layer_still_loads(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    write_inventory(load_cluster(LAB), root / "generated")
    view = ClusterView.load(root, lambda _inv: {"_meta": {"hostvars": {"x": {"a": 1}}}})
    assert view.inventory_dir.sources == ((root / "generated").resolve(),)
    assert view.hostvars("x") == {"a": 1}
    assert json.loads((root / "generated" / "topology.json").read_text())["name"] == "lab"
