"""playbooks/remediate.yml and its role (roles/remediation): bounded tasks, the reboot module's
real defaults, a site override, the extra vars gpuforge passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = REPO / "playbooks" / "remediate.yml"
ROLE = REPO / "roles" / "remediation"
LONG = {
    "ansible.builtin.command",
    "ansible.builtin.systemd_service",
    "ansible.builtin.reboot",
    "ansible.builtin.service_facts",
}


def _tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for task in items:
        out.append(task)
        for section in ("block", "always", "rescue"):
            out += _tasks(task.get(section) or [])
    return out


def _play() -> dict[str, Any]:
    (play,) = yaml.safe_load(PLAYBOOK.read_text())
    return dict(play)


def _role_tasks() -> list[dict[str, Any]]:
    """Every task of the role, its included files' in the order main.yml includes them."""
    main = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    out = []
    for task in main:
        out.append(task)
        include = task.get("ansible.builtin.include_tasks")
        if include:
            out += yaml.safe_load((ROLE / "tasks" / include["file"]).read_text())
    return _tasks(out)


def _defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))


def test_the_play_applies_the_role_with_gpuforges_extra_vars() -> None:
    play = _play()
    (role,) = play["roles"]
    assert role["role"] == "remediation"
    assert "tasks" not in play
    assert role["vars"]["remediation_action"] == "{{ remediate_action | default('') }}"
    assert role["vars"]["remediation_gpus"] == "{{ remediate_gpus | default([]) }}"


def test_every_long_task_has_a_timeout() -> None:
    tasks = _role_tasks()
    long = [t for t in tasks if LONG & set(t)]
    assert len(long) >= 6
    assert all("timeout" in t for t in long), [t["name"] for t in long if "timeout" not in t]


def test_reboot_commands_are_site_variables_with_the_real_defaults() -> None:
    (reboot,) = [t for t in _role_tasks() if "ansible.builtin.reboot" in t]
    args = reboot["ansible.builtin.reboot"]
    assert args["reboot_command"] == "{{ remediation_reboot_command }}"
    assert args["boot_time_command"] == "{{ remediation_boot_time_command }}"
    # role defaults sit under the inventory, and the old site names stay in default(), so a
    # site's group_vars (the lab's PID-1 probe) win
    defaults = _defaults()
    boot = defaults["remediation_boot_time_command"]
    assert "gpuforge_boot_time_command | default(" in boot  # shared with the driver role
    assert "cat /proc/sys/kernel/random/boot_id" in boot  # ansible.builtin.reboot's own default
    assert "shutdown -r 0" in defaults["remediation_reboot_command"]
    assert "remediate_reboot_command | default(" in defaults["remediation_reboot_command"]


def test_gpu_reset_is_nvidia_smi_per_gpu_or_all() -> None:
    commands = [
        t["ansible.builtin.command"] for t in _role_tasks() if "ansible.builtin.command" in t
    ]
    assert commands == [
        "nvidia-smi -r",
        "nvidia-smi -r -i {{ item | int }}",
        "systemctl is-system-running --wait",  # after a reboot: services up before validation
    ]
