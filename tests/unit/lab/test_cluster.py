"""gpuforge.lab.cluster without podman: the plan, and the files that make SSH and Ansible work."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.lab import cluster
from gpuforge.lab.cluster import LabNode, LabPlan
from gpuforge.topology import load_cluster

LAB_SPEC = Path(__file__).resolve().parents[3] / "examples" / "topologies" / "lab.yaml"


@pytest.fixture
def plan() -> LabPlan:
    return LabPlan(
        name="t",
        domain="t.test",
        subnet="10.9.0.0/24",
        gateway="10.9.0.1",
        nodes=(
            LabNode("ctl01", "ctl01.t.test", "controller", "10.9.0.10"),
            LabNode("gpu01", "gpu01.t.test", "gpu", "10.9.0.11"),
        ),
    )


def test_plan_from_the_lab_spec_uses_management_addresses() -> None:
    plan = cluster.plan_from_cluster(load_cluster(LAB_SPEC))
    assert plan.name == "lab"
    assert plan.subnet == "10.231.0.0/24"
    assert plan.gateway == "10.231.0.1"
    assert len(plan.nodes) == 9
    assert plan.nodes[0] == LabNode("ctl01", "ctl01.lab.gpuforge.test", "controller", "10.231.0.10")


def test_names_derive_from_the_lab_name(plan: LabPlan) -> None:
    assert plan.network == "gpuforge-t"
    assert plan.mirror_name == "t-mirror"
    assert plan.container("gpu01") == "t-gpu01"


def test_mirror_takes_the_highest_free_address(plan: LabPlan) -> None:
    assert plan.mirror_address == "10.9.0.254"
    crowded = LabPlan(
        "t", "t.test", "10.9.0.0/30", "10.9.0.1", (LabNode("a", "a.t", "gpu", "10.9.0.2"),)
    )
    with pytest.raises(InputError, match="no free address"):
        _ = crowded.mirror_address


@pytest.mark.parametrize("name", ["gpu01", "gpu01.t.test", "t-gpu01"])
def test_node_lookup_by_any_name(plan: LabPlan, name: str) -> None:
    assert plan.node(name).hostname == "gpu01"


def test_unknown_node_lists_the_known_ones(plan: LabPlan) -> None:
    with pytest.raises(InputError, match="nodes: ctl01, gpu01"):
        plan.node("gpu99")


def test_address_outside_the_subnet_is_refused(plan: LabPlan) -> None:
    bad = LabPlan(
        "t", "t.test", "10.9.0.0/24", "10.9.0.1", (LabNode("a", "a.t", "gpu", "10.8.0.5"),)
    )
    with pytest.raises(InputError, match=r"outside 10\.9\.0\.0/24"):
        cluster._validate(bad)


def test_etc_hosts_lists_every_node_and_the_mirror(plan: LabPlan) -> None:
    hosts = cluster._etc_hosts(plan).splitlines()
    assert "10.9.0.10\tctl01.t.test ctl01" in hosts
    assert "10.9.0.11\tgpu01.t.test gpu01" in hosts
    assert "10.9.0.254\tt-mirror" in hosts
    assert "127.0.0.1\tlocalhost" in hosts


def test_lab_up_again_keeps_what_roles_added_to_etc_hosts(plan: LabPlan) -> None:
    block = cluster._etc_hosts(plan)
    assert cluster.with_lab_block("127.0.1.1 debian\n", block) == block  # fresh container
    managed = "# BEGIN gpuforge cluster hosts\n10.9.0.11\tgpu01\n# END gpuforge cluster hosts\n"
    old = block.replace("t-mirror", "old-mirror")
    assert cluster.with_lab_block(old + managed, block) == block + managed
    assert cluster.with_lab_block(block + managed, block) == block + managed


def test_known_hosts_names_each_node_three_ways(plan: LabPlan) -> None:
    keys = {"ctl01": ("ssh-ed25519 AAAActl", True), "gpu01": ("ssh-ed25519 AAAAgpu", False)}
    assert cluster._known_hosts(plan, keys).splitlines() == [
        "ctl01,ctl01.t.test,10.9.0.10 ssh-ed25519 AAAActl",
        "gpu01,gpu01.t.test,10.9.0.11 ssh-ed25519 AAAAgpu",
    ]


def test_ssh_config_checks_host_keys(plan: LabPlan, tmp_path: Path) -> None:
    text = cluster._ssh_config(plan, tmp_path, tmp_path / "ssh" / "id_ed25519")
    assert "Host gpu01 gpu01.t.test\n  HostName 10.9.0.11\n" in text
    assert "  StrictHostKeyChecking yes\n" in text
    assert f"  UserKnownHostsFile {tmp_path / 'known_hosts'}\n" in text
    assert f"  IdentityFile {tmp_path / 'ssh' / 'id_ed25519'}\n" in text


def test_ansible_cfg_points_at_the_lab(tmp_path: Path) -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(cluster._ansible_cfg(tmp_path))
    assert cfg["defaults"]["inventory"] == str(tmp_path / "inventory")
    assert cfg["defaults"]["host_key_checking"] == "true"
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in cfg["ssh_connection"]["ssh_args"]
    assert "ControlPersist" in cfg["ssh_connection"]["ssh_args"]  # the repository's settings kept


def test_lab_vars_point_roles_at_the_mirror_and_ssh_at_the_lab_host_keys(
    plan: LabPlan, tmp_path: Path
) -> None:
    import yaml  # noqa: PLC0415

    data = yaml.safe_load(cluster._lab_vars(plan, tmp_path))["all"]["vars"]
    assert data["ansible_ssh_common_args"] == (
        f"-o UserKnownHostsFile={tmp_path / 'known_hosts'} -o StrictHostKeyChecking=yes"
    )
    assert data["gpuforge_apt_repo_url"] == "http://t-mirror/"
    assert data["gpuforge_apt_repo_key_url"] == "http://t-mirror/gpuforge-lab.asc"
    assert data["gpuforge_apt_repo_suite"] == "stable"


def test_write_if_changed_reports_only_real_changes(plan: LabPlan, tmp_path: Path) -> None:
    result = cluster.UpResult(plan=plan, state_dir=tmp_path)
    cluster._write_if_changed(tmp_path / "f", "a\n", result)
    cluster._write_if_changed(tmp_path / "f", "a\n", result)
    assert result.files_changed == [str(tmp_path / "f")]
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600
