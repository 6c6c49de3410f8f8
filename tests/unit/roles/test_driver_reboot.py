"""The driver role's reboot: which hosts it reboots, and how it tells that they came back.

The handlers' ``when:`` lists are evaluated with Ansible's own templating against the role's
defaults and vars, as a play would: a container (a lab node) reboots when the inventory gives a
boot-time command that sees it restart, and not with the kernel's boot_id, which a container
shares with its host (the reboot would wait for a change that never comes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.template import Templar, trust_as_template

ROLE = Path(__file__).resolve().parents[3] / "roles" / "nvidia_driver"
LAB_BOOT_TIME = "cut -d' ' -f22 /proc/1/stat"


def _handlers() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    return {h["name"]: h for h in doc}


def _trusted(variables: dict[str, Any]) -> dict[str, Any]:
    """Variables as a play holds them: strings from role files are templates."""
    return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}


def _template(text: str, variables: dict[str, Any]) -> Any:
    return Templar(loader=None, variables=_trusted(variables)).template(trust_as_template(text))


def _runs(handler: dict[str, Any], inventory: dict[str, Any]) -> bool:
    variables: dict[str, Any] = {}
    for layer in ("defaults", "vars"):
        variables.update(yaml.safe_load((ROLE / layer / "main.yml").read_text()))
    variables.update(inventory)
    when = handler["when"] if isinstance(handler["when"], list) else [handler["when"]]
    expr = " and ".join(f"({w})" for w in when)
    result = _template("{{ " + expr + " }}", variables)
    assert isinstance(result, bool), result
    return result


@pytest.mark.parametrize(
    ("inventory", "reboots"),
    [
        ({"nvidia_driver_allow_reboot": False, "_common_in_container": False}, False),
        ({"nvidia_driver_allow_reboot": True, "_common_in_container": False}, True),
        # a container with the kernel's boot_id: skipped and reported, never a 30-minute hang
        ({"nvidia_driver_allow_reboot": True, "_common_in_container": True}, False),
        (
            {
                "nvidia_driver_allow_reboot": True,
                "_common_in_container": True,
                "gpuforge_boot_time_command": LAB_BOOT_TIME,
            },
            True,
        ),
    ],
)
def test_reboot_runs_where_its_return_can_be_seen(inventory: dict[str, Any], reboots: bool) -> None:
    handlers = _handlers()
    assert _runs(handlers["Reboot to load the new driver"], inventory) is reboots
    assert _runs(handlers["Refresh the cached facts after the reboot"], inventory) is reboots
    skipped = inventory["nvidia_driver_allow_reboot"] and not reboots
    assert _runs(handlers["Report that this container is not rebooted"], inventory) is skipped


def test_reboot_waits_on_the_shared_boot_time_command() -> None:
    reboot = _handlers()["Reboot to load the new driver"]["ansible.builtin.reboot"]
    assert reboot["boot_time_command"] == "{{ nvidia_driver_boot_time_command }}"
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    command = defaults["nvidia_driver_boot_time_command"]
    assert _template(command, defaults) == "cat /proc/sys/kernel/random/boot_id"
    # the lab's inventory sets it (tests/unit/lab/test_files.py), remediate.yml reads it too
    shared = {**defaults, "gpuforge_boot_time_command": LAB_BOOT_TIME}
    assert _template(command, shared) == LAB_BOOT_TIME
