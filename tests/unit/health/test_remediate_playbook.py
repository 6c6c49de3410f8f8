"""playbooks/remediate.yml: bounded tasks, the reboot module's real defaults, a site override."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PLAYBOOK = Path(__file__).resolve().parents[3] / "playbooks" / "remediate.yml"
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


def test_every_long_task_has_a_timeout() -> None:
    tasks = _tasks(_play()["tasks"])
    long = [t for t in tasks if LONG & set(t)]
    assert len(long) >= 6
    assert all("timeout" in t for t in long), [t["name"] for t in long if "timeout" not in t]


def test_reboot_commands_are_site_variables_with_the_real_defaults() -> None:
    play = _play()
    (reboot,) = [t for t in _tasks(play["tasks"]) if "ansible.builtin.reboot" in t]
    args = reboot["ansible.builtin.reboot"]
    assert args["reboot_command"] == "{{ __remediate_reboot_command }}"
    assert args["boot_time_command"] == "{{ __remediate_boot_time_command }}"
    # play vars would outrank the inventory: the defaults sit in default(), so a site's
    # group_vars (the lab's PID-1 probe) win
    boot = play["vars"]["__remediate_boot_time_command"]
    assert "gpuforge_boot_time_command | default(" in boot  # shared with the driver role
    assert "cat /proc/sys/kernel/random/boot_id" in boot  # ansible.builtin.reboot's own default
    assert "shutdown -r 0" in play["vars"]["__remediate_reboot_command"]


def test_gpu_reset_is_nvidia_smi_per_gpu_or_all() -> None:
    commands = [
        t["ansible.builtin.command"]
        for t in _tasks(_play()["tasks"])
        if "ansible.builtin.command" in t
    ]
    assert commands == [
        "nvidia-smi -r",
        "nvidia-smi -r -i {{ item | int }}",
        "systemctl is-system-running --wait",  # after a reboot: services up before validation
    ]
