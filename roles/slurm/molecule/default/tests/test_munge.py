"""The munge key: one key, owned by munge, mode 0400, and never in Ansible's log or artifacts."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

testinfra_hosts = [
    "ansible://gfslurm-ctl01",
    "ansible://gfslurm-gpu01",
    "ansible://gfslurm-gpu02",
]

KEY = "/etc/munge/munge.key"


def test_key_owner(host: Any) -> None:
    assert host.file(KEY).user == "munge"


def test_key_mode(host: Any) -> None:
    assert host.file(KEY).mode == 0o400


def test_key_is_the_controllers(host: Any) -> None:
    ctl = host.get_host("ansible://gfslurm-ctl01", ansible_inventory=host.backend.ansible_inventory)
    assert host.file(KEY).sha256sum == ctl.file(KEY).sha256sum


def test_munged_running(host: Any) -> None:
    assert host.service("munge").is_running


def _needles(key: bytes) -> list[bytes]:
    b64 = base64.b64encode(key)
    # Any 64-character window of the base64 text or 32-byte window of the raw key is enough
    # to leak it; check the start, the middle and the hex form.
    return [b64[:64], b64[len(b64) // 2 : len(b64) // 2 + 64], key[:32], key.hex()[:64].encode()]


def test_key_never_in_ansible_log_or_artifacts(host: Any) -> None:
    if host.backend.get_hostname() != "gfslurm-ctl01":
        pytest.skip("the key is searched for once, from the controller")
    # Read the key with podman exec, not through Ansible: testinfra runs every command of the
    # ansible:// hosts (connection podman) as an ansible ad-hoc call, which would write the key's
    # bytes into the very log searched below (and ansible-core 2.19 rejects binary output).
    key = host.get_host(f"podman://{host.backend.get_hostname()}").file(KEY).content
    assert len(key) >= 32
    ephemeral = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    log = ephemeral / "ansible.log"
    assert log.is_file(), "ANSIBLE_LOG_PATH was not honoured"
    leaks = [
        str(path)
        for path in ephemeral.rglob("*")
        if path.is_file() and any(needle in path.read_bytes() for needle in _needles(key))
    ]
    assert leaks == []
