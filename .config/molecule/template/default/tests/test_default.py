"""Verify <role> on the Molecule instance: one fact per test (replace the examples)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("name", ["openssh-server", "python3"])
def test_package_installed(host, name):
    assert host.package(name).is_installed


def test_sshd_running(host):
    assert host.service("ssh").is_running
