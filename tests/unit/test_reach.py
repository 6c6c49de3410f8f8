"""Preflight decides reachability for a whole batch within one deadline, however large."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuforge import reach
from gpuforge.execution import plays
from gpuforge.rollout import steps
from gpuforge.rollout.steps import AnsibleSteps, PlayTimeout


@pytest.fixture
def hung_port() -> Iterator[int]:
    """An sshd that accepts (the kernel completes the handshake) and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def sshd_port() -> Iterator[int]:
    """Answers every connection with an OpenSSH banner, after a line RFC 4253 allows before it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.sendall(b"Welcome\r\nSSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    server.close()


@pytest.fixture
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def test_answering_hung_and_closed_nodes(hung_port: int, sshd_port: int, closed_port: int) -> None:
    nodes = [
        reach.SshdEndpoint("good", "127.0.0.1", sshd_port),
        reach.SshdEndpoint("hung", "127.0.0.1", hung_port),
        reach.SshdEndpoint("gone", "127.0.0.1", closed_port),
    ]
    started = time.monotonic()
    silent = reach.probe(nodes, deadline_s=1.5)
    assert time.monotonic() - started < 3
    assert set(silent) == {"hung", "gone"}
    assert "no answer in 1.5 s waiting for the SSH banner" in silent["hung"]
    assert "cannot connect" in silent["gone"]


def test_a_large_hung_batch_takes_one_deadline_not_one_per_node(hung_port: int) -> None:
    nodes = [reach.SshdEndpoint(f"gpu{i:04d}", "127.0.0.1", hung_port) for i in range(600)]
    started = time.monotonic()
    silent = reach.probe(nodes, deadline_s=2.0)
    elapsed = time.monotonic() - started
    assert len(silent) == 600
    assert elapsed < 5, f"{elapsed:.1f} s for 600 hung nodes"


def test_default_deadline_is_within_preflights_30_s() -> None:
    assert reach.DEADLINE_S <= 30


def test_targets_leave_jump_hosts_and_other_connections_to_ansible() -> None:
    hostvars: dict[str, dict[str, Any]] = {
        "a": {"ansible_host": "10.0.0.1", "ansible_port": 2222},
        "b": {"ansible_ssh_common_args": "-o ProxyJump=bastion"},
        "c": {"ansible_connection": "community.general.podman"},
        "d": {},
    }
    found = reach.targets(hostvars, ["a", "b", "c", "d"])
    assert found == [reach.SshdEndpoint("a", "10.0.0.1", 2222), reach.SshdEndpoint("d", "d", 22)]


def test_preflight_plays_only_on_nodes_that_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hung_port: int, sshd_port: int
) -> None:
    hostvars = {
        "gpu01": {"ansible_host": "127.0.0.1", "ansible_port": sshd_port},
        "gpu02": {"ansible_host": "127.0.0.1", "ansible_port": hung_port},
    }
    monkeypatch.setattr(steps, "list_inventory", lambda _inv: {"_meta": {"hostvars": hostvars}})
    monkeypatch.setattr(plays, "list_inventory", lambda _inv: {"_meta": {"hostvars": hostvars}})
    monkeypatch.setattr(plays.InventoryDir, "open", lambda _p: type("I", (), {"sources": ()})())
    monkeypatch.setattr(reach, "DEADLINE_S", 1.0)
    played: dict[str, Any] = {}

    def fake_run(playbook: str, _inventory: Any, **kw: Any) -> Any:
        played.update(kw, playbook=playbook)
        return type("R", (), {"unreachable": {}, "failed": {}, "hosts": {"gpu01": None}})()

    monkeypatch.setattr(plays, "run_playbook", fake_run)
    ansible = AnsibleSteps(
        inventory=tmp_path,
        artifacts=tmp_path / "a",
        validate_fn=lambda *_a: None,  # type: ignore[arg-type,return-value]
        admission=None,  # type: ignore[arg-type]
        play_timeout=PlayTimeout(forks=16),
    )
    problems = ansible.preflight(["gpu01", "gpu02"])
    assert list(problems) == ["gpu02"]
    assert problems["gpu02"].startswith("unreachable: no answer in 1 s")
    assert played["limit"] == "gpu01"
    assert played["env"]["ANSIBLE_SSH_RETRIES"] == "0"
    assert played["timeout_s"] == 600 + 120


def test_whole_run_limit_scales_with_the_batch_and_is_configurable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit = PlayTimeout(forks=16)
    assert limit.for_batch(16, 3600) == 600 + 3600
    assert limit.for_batch(1000, 3600) == 600 + 63 * 3600
    monkeypatch.setenv("GPUFORGE_PLAY_TIMEOUT_S", "900")
    assert PlayTimeout.from_env().for_batch(1000, 3600) == 900
    monkeypatch.setenv("GPUFORGE_PLAY_TIMEOUT_S", "soon")
    with pytest.raises(Exception, match="not whole numbers"):
        PlayTimeout.from_env()


@pytest.mark.parametrize("how", ["ssh-config", "ansible-ssh-args", "opt-out"])
def test_no_probe_when_connections_may_go_through_a_proxy(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if how == "ssh-config":
        (tmp_path / ".ssh").mkdir()
        (tmp_path / ".ssh" / "config").write_text("Host gpu*\n  ProxyJump bastion\n")
    elif how == "ansible-ssh-args":
        monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o ProxyCommand='ssh -W %h:%p bastion'")
    else:
        monkeypatch.setenv("GPUFORGE_PREFLIGHT_PROBE", "0")
    assert reach.targets({"a": {"ansible_host": "10.0.0.1"}}, ["a"]) == []
