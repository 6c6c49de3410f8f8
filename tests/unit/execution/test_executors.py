from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.execution import executors
from gpuforge.execution.executors import ExecutionHost


def _fake_venv(root: Path, script: str) -> str:
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return str(root)


def test_the_controller_passes_its_own_preflight() -> None:
    executors.preflight([executors.LOCAL])
    assert executors.probe(executors.LOCAL) == executors.controller_versions()


def test_preflight_names_a_host_without_a_runner(tmp_path: Path) -> None:
    bad = ExecutionHost("ex9", None, venv=str(tmp_path / "nothing"))
    with pytest.raises(InputError, match="ex9: unreachable or no runner"):
        executors.preflight([executors.LOCAL, bad])


def test_preflight_names_each_wrong_version(tmp_path: Path) -> None:
    venv = _fake_venv(
        tmp_path / "old",
        """echo '{"ansible": "12.3.0", "ansible-runner": "2.3.0","""
        """ "ansible-core": "2.19.14", "mitogen": null}'""",
    )
    want = executors.controller_versions()
    with pytest.raises(InputError) as err:
        executors.preflight([ExecutionHost("ex2", None, venv=venv)])
    text = str(err.value)
    assert f"ex2: ansible-runner 2.3.0 (want {want['ansible-runner']})" in text
    assert "ansible 12.3.0" not in text
    assert f"mitogen missing (want {want['mitogen']})" in text
    assert "ansible-core" not in text


def test_preflight_reports_a_silent_host_within_its_timeout(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path / "slow", "sleep 30")
    with pytest.raises(InputError, match="no answer in 1 s"):
        executors.preflight([ExecutionHost("ex3", None, venv=venv)], timeout_s=1)


def test_ssh_host_runs_the_worker_through_ssh_in_batch_mode() -> None:
    host = ExecutionHost("ex1", ssh="root@ex1", venv="/opt/r", ssh_args=("-p", "2222"))
    argv = host.worker_command()
    assert argv[0] == "ssh"
    assert "BatchMode=yes" in argv
    assert argv[-2] == "root@ex1"
    assert argv[-3:-1] == ["2222", "root@ex1"]
    assert "V=/opt/r;" in argv[-1]
    assert '"$V/bin/ansible-runner" worker' in argv[-1]
    assert "--private-data-dir" in argv[-1]


def test_local_worker_runs_under_the_play_guard() -> None:
    argv = executors.LOCAL.worker_command()
    assert argv[:3] == [sys.executable, "-m", "gpuforge.playguard"]


def _listing(**hostvars: dict[str, object]) -> dict[str, object]:
    return {
        executors.EXECUTION_GROUP: {"hosts": list(hostvars)},
        "_meta": {"hostvars": hostvars},
    }


def test_execution_hosts_come_from_the_site_inventory_group() -> None:
    listing = _listing(
        ex1={"ansible_host": "10.0.0.5", "ansible_user": "root", "ansible_port": 2222},
        ex2={"gpuforge_execution_slots": 4, "gpuforge_runner_venv": "/srv/r"},
    )
    ex1, ex2 = executors.from_inventory(listing)
    assert (ex1.ssh, ex1.ssh_args, ex1.venv, ex1.slots) == (
        "root@10.0.0.5",
        ("-p", "2222"),
        executors.DEFAULT_VENV,
        1,
    )
    assert (ex2.ssh, ex2.venv, ex2.slots) == ("ex2", "/srv/r", 4)


def test_bad_slots_name_the_host() -> None:
    with pytest.raises(InputError, match="ex1: gpuforge_execution_slots 'many'"):
        executors.from_inventory(_listing(ex1={"gpuforge_execution_slots": "many"}))


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"GPUFORGE_EXECUTION": "off"}, None),
        ({"GPUFORGE_EXECUTION": "local"}, (2, None)),
        ({"GPUFORGE_EXECUTION": "local:3", "GPUFORGE_SHARD_HOSTS": "50"}, (3, 50)),
    ],
)
def test_plan_without_execution_hosts(
    environ: dict[str, str], expected: tuple[int, int | None] | None
) -> None:
    got = executors.plan({}, environ)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.hosts[0].slots, got.max_hosts) == expected
        assert got.hosts[0].is_local


def test_plan_prefers_the_inventory_execution_hosts() -> None:
    got = executors.plan(_listing(ex1={}), {"GPUFORGE_EXECUTION": "local"})
    assert got is not None
    assert [h.name for h in got.hosts] == ["ex1"]


@pytest.mark.parametrize(
    "environ",
    [{"GPUFORGE_EXECUTION": "remote"}, {"GPUFORGE_SHARD_HOSTS": "x"}],
)
def test_plan_refuses_bad_settings(environ: dict[str, str]) -> None:
    with pytest.raises(InputError):
        executors.plan({}, environ)
