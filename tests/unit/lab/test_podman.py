"""gpuforge.lab.podman: every call pinned to the lab config, under a timeout, failures explained."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpuforge.errors import OperationError
from gpuforge.lab import podman
from gpuforge.lab.paths import CONTAINERS_CONF


@pytest.fixture
def fake_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a fake ``podman`` (a shell script body) first on PATH; it logs its arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"

    def install(body: str) -> Path:
        script = bindir / "podman"
        script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
        return log

    return install


def test_every_call_uses_the_lab_containers_conf(fake_podman) -> None:
    fake_podman('printf "%s" "$CONTAINERS_CONF"')
    assert podman.text(["info"]) == str(CONTAINERS_CONF)


def test_a_failure_names_the_command_and_its_stderr(fake_podman) -> None:
    fake_podman("echo 'no such container' >&2; exit 125")
    with pytest.raises(OperationError, match=r"podman rm x exited 125: no such container"):
        podman.run(["rm", "x"])


def test_a_hung_call_is_stopped_by_its_timeout(fake_podman) -> None:
    fake_podman("sleep 5")
    with pytest.raises(OperationError, match=r"timed out after 0\.3s: podman ps"):
        podman.run(["ps"], timeout=0.3)


def test_missing_podman_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(OperationError, match="podman is not installed"):
        podman.run(["ps"])


def test_containers_reads_ps_json(fake_podman) -> None:
    rows = [
        {
            "Names": ["lab-gpu02"],
            "State": "running",
            "Labels": {"gpuforge.lab": "lab"},
            "StartedAt": 100,
            "Image": "localhost/gpuforge-node:latest",
        },
        {"Names": ["lab-ctl01"], "State": "exited", "Labels": None, "StartedAt": 0, "Image": "x"},
    ]
    log = fake_podman(f"echo '{json.dumps(rows)}'")
    infos = podman.containers("gpuforge.lab=lab")
    assert [(c.name, c.state, c.started_at) for c in infos] == [
        ("lab-ctl01", "exited", 0),
        ("lab-gpu02", "running", 100),
    ]
    assert infos[1].labels == {"gpuforge.lab": "lab"}
    assert "--filter label=gpuforge.lab=lab" in log.read_text()


def test_put_file_keeps_the_content_off_every_command_line(fake_podman, tmp_path: Path) -> None:
    copied = tmp_path / "copied"
    log = fake_podman(f'if [ "$1" = cp ]; then cat "$2" > {copied}; fi')
    podman.put_file("lab-gpu01", b"PRIVATE-CONTENT", "/var/lib/x/state.json", mode="0600")
    calls = log.read_text()
    assert "PRIVATE-CONTENT" not in calls
    assert copied.read_bytes() == b"PRIVATE-CONTENT"
    assert "lab-gpu01:/var/lib/x/state.json.gpuforge-tmp" in calls
    assert "0600 /var/lib/x/state.json.gpuforge-tmp /var/lib/x/state.json" in calls
