"""The playbook facade starts every play under the guard, with gpuforge's Ansible settings."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpuforge.playbook import run_playbook

#: Stands in for ansible-playbook: reports who started it and with which settings.
_SPY = """\
import json, os
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
record = os.environ.get("GPUFORGE_PLAY_RECORD", "")
with open(os.environ["SPY_OUT"], "w") as out:
    json.dump({
        "parent": [p.decode() for p in parent if p],
        "record_written": bool(record) and os.path.exists(record),
        "deprecations": os.environ.get("ANSIBLE_DEPRECATION_WARNINGS"),
        "timeout": os.environ.get("ANSIBLE_TIMEOUT"),
        "fact_cache": os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION"),
        "pgid_is_guard": os.getpgrp() == os.getppid(),
    }, out)
"""


@pytest.fixture
def spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A spy ``ansible-playbook`` first on the PATH; returns where it writes what it saw."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ansible-playbook"
    fake.write_text(f"#!{sys.executable}\n{_SPY}")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPY_OUT", str(tmp_path / "spy.json"))
    return tmp_path / "spy.json"


def test_the_play_runs_under_the_guard(tmp_path: Path, spy: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    record = tmp_path / "rollout.play"
    run_playbook(
        "site.yml", inventory, play_record=record, env={"ANSIBLE_TIMEOUT": "7"}, timeout_s=60
    )
    seen = json.loads(spy.read_text())
    assert seen["parent"][1:3] == ["-m", "gpuforge.playguard"]
    assert seen["record_written"] is True
    assert seen["pgid_is_guard"] is True
    assert seen["deprecations"] == "False"
    assert seen["timeout"] == "7"
    assert not record.exists()  # removed once the play ended


def test_a_relative_play_record_is_written_where_the_caller_meant(
    tmp_path: Path, spy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--state-dir state`` is relative; the guard runs in ansible-runner's private dir."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    record = Path("state/lab/rollout.play")
    run_playbook("site.yml", Path("hosts.yml"), play_record=record, timeout_s=60)
    assert json.loads(spy.read_text())["record_written"] is True


def test_the_fact_cache_outlives_the_run(
    tmp_path: Path, spy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ansible.cfg's fact cache, not ansible-runner's per-run one in the artifacts."""
    cfg = tmp_path / "lab" / "ansible.cfg"
    cfg.parent.mkdir()
    cfg.write_text("[defaults]\ngathering = smart\nfact_caching_connection = facts\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    run_playbook("site.yml", tmp_path / "hosts.yml", timeout_s=60)
    assert json.loads(spy.read_text())["fact_cache"] == str((tmp_path / "lab" / "facts").resolve())
