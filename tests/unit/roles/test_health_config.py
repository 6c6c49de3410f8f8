"""The health role's health.yaml: rendered from the inventory's node type and pins, checked by
the checker itself before it replaces the old file (roles/health/tasks/configure.yml), run with
ansible-playbook against the local machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuforge.node import bundle
from gpuforge.node import config as cfg
from gpuforge.resources import project_path

pytestmark = pytest.mark.slow

ROLES = project_path("roles")
NODE_TYPE = {
    "name": "h100-sxm",
    "gpu_model": "H100-SXM-80GB",
    "gpus": 8,
    "nvswitch": True,
    "rails": [
        {"device": "mlx5_0", "netdev": "ib0", "rail": 0, "rate_gbps": 400},
        {"device": "mlx5_1", "netdev": "ib1", "rail": 1, "rate_gbps": 400},
    ],
}
#: localhost is the node; ctl01, never contacted, is the controller whose address is the default.
INVENTORY = {
    "all": {
        "hosts": {"localhost": {"ansible_connection": "local"}},
        "children": {
            "slurm_controllers": {"hosts": {"ctl01": {"gpuforge_mgmt_address": "10.1.0.5"}}},
            # the collector's host, as the generated inventory makes it: the controllers
            "gpuforge_services": {"hosts": {"ctl01": {}}},
        },
    }
}
PLAY = """
- hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - ansible.builtin.include_role:
        name: health
        tasks_from: configure.yml
"""


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.build(tmp_path_factory.mktemp("pyz"))


def converge(tmp: Path, pyz: Path, extra: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp / "play.yml").write_text(PLAY)
    variables = {
        "__health_bundle": str(pyz),
        "__health_config": str(tmp / "health.yaml"),
        "inventory_hostname": "gpu07",
        "gpu_node_type": NODE_TYPE,
        "fabric_kind": "infiniband",
        "nvidia_driver_version": "570.133.20",
        "nccl_version": "2.26.2",
        "slurm_version": "22.05.8",
        **extra,
    }
    (tmp / "vars.json").write_text(json.dumps(variables))
    (tmp / "hosts.yml").write_text(json.dumps(INVENTORY))
    env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=str(ROLES),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
    )
    env.pop("ANSIBLE_CONFIG", None)
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp / "hosts.yml"),
            str(tmp / "play.yml"),
            "-e",
            f"@{tmp / 'vars.json'}",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_config_is_the_nodes_declared_shape(tmp_path: Path, pyz: Path) -> None:
    done = converge(tmp_path, pyz, {})
    assert done.returncode == 0, done.stdout[-3000:]
    loaded = cfg.load(tmp_path / "health.yaml")
    assert loaded.node == "gpu07"
    assert loaded.collector is not None
    assert loaded.collector.url == "http://10.1.0.5:9477"
    e = loaded.expect
    assert (e.gpus, e.gpu_model, e.nvlink_links_per_gpu) == (8, "H100-SXM-80GB", 18)
    assert (e.pcie_gen, e.pcie_width) == (5, 16)
    assert [(r.device, r.netdev, r.rate_gbps) for r in e.rails] == [
        ("mlx5_0", "ib0", 400),
        ("mlx5_1", "ib1", 400),
    ]
    # pins the inventory does not carry (cuda, dcgm) are left out, not checked against ""
    assert dict(e.versions) == {
        "driver": "570.133.20",
        "nccl": "2.26.2",
        "fabricmanager": "570.133.20",
        "slurm": "22.05.8",
    }
    assert e.services == ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "slurmd")


def test_roce_rails_and_mtu_and_check_switches(tmp_path: Path, pyz: Path) -> None:
    done = converge(
        tmp_path,
        pyz,
        {
            "fabric_kind": "roce",
            "health_expect_rail_mtu": 9000,
            "health_checks": {"fabric.counters": {"enabled": False}, "gpu.xid": {"shadow": True}},
            "health_collector_url": "",
        },
    )
    assert done.returncode == 0, done.stdout[-3000:]
    loaded = cfg.load(tmp_path / "health.yaml")
    assert loaded.collector is None
    assert {(r.link_layer, r.mtu) for r in loaded.expect.rails} == {("Ethernet", 9000)}
    assert loaded.check("fabric.counters").enabled is False
    assert loaded.check("gpu.xid").shadow is True


def test_a_bad_setting_fails_naming_the_key_and_the_old_file_stays(
    tmp_path: Path, pyz: Path
) -> None:
    assert converge(tmp_path, pyz, {}).returncode == 0
    before = (tmp_path / "health.yaml").read_text()
    done = converge(tmp_path, pyz, {"health_checks": {"gpu.xid": {"fail_after": 0}}})
    assert done.returncode != 0
    assert "checks.gpu.xid.fail_after" in done.stdout
    assert (tmp_path / "health.yaml").read_text() == before
