"""gpuforge.lab.files: the files that make SSH and Ansible reach the lab."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import yaml

from gpuforge.inventory.reader import InventoryDir
from gpuforge.lab import files
from gpuforge.lab.plan import LabPlan


def test_etc_hosts_lists_every_node_and_the_mirror(plan: LabPlan) -> None:
    hosts = files.etc_hosts(plan).splitlines()
    assert "10.9.0.10\tctl01.t.test ctl01" in hosts
    assert "10.9.0.11\tgpu01.t.test gpu01" in hosts
    assert "10.9.0.254\tt-mirror" in hosts
    assert "127.0.0.1\tlocalhost" in hosts


def test_lab_up_again_keeps_what_roles_added_to_etc_hosts(plan: LabPlan) -> None:
    block = files.etc_hosts(plan)
    assert files.with_lab_block("127.0.1.1 debian\n", block) == block  # fresh container
    managed = "# BEGIN gpuforge cluster hosts\n10.9.0.11\tgpu01\n# END gpuforge cluster hosts\n"
    old = block.replace("t-mirror", "old-mirror")
    assert files.with_lab_block(old + managed, block) == block + managed
    assert files.with_lab_block(block + managed, block) == block + managed


def test_known_hosts_names_each_node_three_ways(plan: LabPlan) -> None:
    keys = {"ctl01": "ssh-ed25519 AAAActl", "gpu01": "ssh-ed25519 AAAAgpu"}
    assert files.known_hosts(plan, keys).splitlines() == [
        "ctl01,ctl01.t.test,10.9.0.10 ssh-ed25519 AAAActl",
        "gpu01,gpu01.t.test,10.9.0.11 ssh-ed25519 AAAAgpu",
    ]


def test_ssh_config_checks_host_keys(plan: LabPlan, tmp_path: Path) -> None:
    text = files.ssh_config(plan, tmp_path, tmp_path / "ssh" / "id_ed25519")
    assert "Host gpu01 gpu01.t.test\n  HostName 10.9.0.11\n" in text
    assert "  StrictHostKeyChecking yes\n" in text
    assert f"  UserKnownHostsFile {tmp_path / 'known_hosts'}\n" in text
    assert f"  IdentityFile {tmp_path / 'ssh' / 'id_ed25519'}\n" in text


def test_ansible_cfg_reads_both_layers_of_the_lab_inventory(tmp_path: Path) -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(files.ansible_cfg(tmp_path, InventoryDir(tmp_path / "inventory")))
    assert cfg["defaults"]["inventory"] == (
        f"{tmp_path / 'inventory' / 'generated'},{tmp_path / 'inventory' / 'site'}"
    )
    assert cfg["defaults"]["host_key_checking"] == "true"
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in cfg["ssh_connection"]["ssh_args"]
    assert "ControlPersist" in cfg["ssh_connection"]["ssh_args"]  # the project's settings kept
    assert "^slurm$" in cfg["inventory"]["ignore_patterns"]


def test_site_layer_reaches_the_nodes_with_the_lab_host_keys(plan: LabPlan, tmp_path: Path) -> None:
    out = files.site_files(plan, tmp_path, tmp_path / "ssh" / "id_ed25519")
    assert sorted(out) == [
        "group_vars/all/connection.yml",
        "group_vars/all/mirror.yml",
        "group_vars/gpu_nodes/simulator.yml",
        "group_vars/monitoring/lab.yml",
        "hosts.yml",
    ]
    simulator = yaml.safe_load(out["group_vars/gpu_nodes/simulator.yml"])
    assert simulator["node_exporter_path_sysfs"] == "/var/lib/gpuforge-sim/sys"
    # every reboot gpuforge makes (remediate.yml, the driver role) sees a restarted container
    assert simulator["gpuforge_boot_time_command"] == "cut -d' ' -f22 /proc/1/stat"
    assert simulator["nvidia_driver_sysfs_root"] == "/var/lib/gpuforge-sim/sys"
    assert yaml.safe_load(out["group_vars/monitoring/lab.yml"]) == {
        "alertmanager_webhook_sink": True
    }
    hosts = json.loads(out["hosts.yml"])["all"]["hosts"]
    assert hosts == {"ctl01": {"ansible_host": "10.9.0.10"}, "gpu01": {"ansible_host": "10.9.0.11"}}
    conn = yaml.safe_load(out["group_vars/all/connection.yml"])
    assert conn == {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(tmp_path / "ssh" / "id_ed25519"),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={tmp_path / 'known_hosts'} -o StrictHostKeyChecking=yes"
        ),
    }


def test_site_layer_points_roles_at_the_lab_mirror(plan: LabPlan, tmp_path: Path) -> None:
    out = files.site_files(plan, tmp_path, tmp_path / "key")
    mirror = yaml.safe_load(out["group_vars/all/mirror.yml"])
    assert mirror == {
        "gpuforge_apt_repo_url": "http://t-mirror/",
        "gpuforge_apt_repo_suite": "stable",
        "gpuforge_apt_repo_components": ["main"],
        "gpuforge_apt_repo_key_url": "http://t-mirror/gpuforge-lab.asc",
    }
