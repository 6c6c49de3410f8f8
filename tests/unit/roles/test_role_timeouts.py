"""Every task of a role that can run long or hang carries a task-level ``timeout:``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"
#: Modules that download, install, start services, wait or run commands: any of them can hang.
LONG_RUNNING = {
    "ansible.builtin.apt",
    "ansible.builtin.dnf",
    "ansible.builtin.package",
    "ansible.builtin.get_url",
    "ansible.builtin.uri",
    "ansible.builtin.command",
    "ansible.builtin.shell",
    "ansible.builtin.script",
    "ansible.builtin.systemd_service",
    "ansible.builtin.systemd",
    "ansible.builtin.service",
    "ansible.builtin.wait_for",
    "ansible.builtin.reboot",
    "ansible.builtin.unarchive",
    "community.general.modprobe",
    "community.general.dnf_versionlock",
}
TASK_FILES = sorted(
    p for p in ROLES_DIR.glob("*/*/*.yml") if p.parent.name in ("tasks", "handlers")
)


def _tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for task in items or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section, []))


def _untimed(path: Path) -> list[str]:
    return [
        str(task.get("name"))
        for task in _tasks(yaml.safe_load(path.read_text()))
        if LONG_RUNNING & set(task) and "timeout" not in task
    ]


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(ROLES_DIR)))
def test_long_running_tasks_have_a_timeout(path: Path) -> None:
    assert _untimed(path) == []


def test_the_check_finds_a_task_without_timeout(tmp_path: Path) -> None:
    tasks = tmp_path / "main.yml"
    tasks.write_text(
        "- name: Install\n  ansible.builtin.apt:\n    name: x\n"
        "- name: Block\n  block:\n    - name: Wait\n      ansible.builtin.wait_for:\n"
        "        port: 22\n        timeout: 10\n"
        "- name: Timed\n  ansible.builtin.command: 'true'\n  timeout: 5\n"
    )
    assert _untimed(tasks) == ["Install", "Wait"]
