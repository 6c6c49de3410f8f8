"""Verify the execution_host role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VENV = "/opt/gpuforge/runner"
PINS = {
    "ansible": "12.3.0",
    "ansible-runner": "2.4.3",
    "ansible-core": "2.19.14",
    "mitogen": "0.3.54",
}


@pytest.mark.parametrize(("name", "version"), sorted(PINS.items()))
def test_pinned_version_installed(host, name, version):
    got = host.check_output(
        f"{VENV}/bin/python -c 'import importlib.metadata as m; print(m.version(\"{name}\"))'"
    )
    assert got == version


def test_worker_answers(host):
    info = host.check_output(f"{VENV}/bin/ansible-runner worker --worker-info")
    assert f"runner_version: {PINS['ansible-runner']}" in info


def test_mitogen_strategy_plugin_present(host):
    path = host.check_output(
        f"{VENV}/bin/python -c 'import ansible_mitogen,os;"
        "print(os.path.dirname(ansible_mitogen.__file__))'"
    )
    assert host.file(f"{path}/plugins/strategy/mitogen_linear.py").exists


def test_installed_without_an_index(host):
    config = host.run(f"{VENV}/bin/python -m pip config list").stdout
    assert "index-url" not in config
    assert host.file("/var/cache/gpuforge/wheelhouse").is_directory
    wheels = host.run("ls /var/cache/gpuforge/wheelhouse").stdout.split()
    assert any(w.startswith("ansible_runner-2.4.3") for w in wheels), json.dumps(wheels)
