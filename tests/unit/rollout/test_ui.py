"""Deploy progress: live on a terminal, one plain line per stage and failed host elsewhere."""

from __future__ import annotations

import io
import re

from rich.console import Console

from gpuforge.rollout.ui import DeployProgress, PlainProgress, deploy_progress


def _event(kind: str, host: str, **data: object) -> dict[str, object]:
    return {"event": kind, "event_data": {"host": host, **data}}


def test_a_terminal_gets_the_live_display() -> None:
    console = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(deploy_progress(console), DeployProgress)


def test_a_log_gets_one_line_per_stage_and_per_failed_host() -> None:
    out = io.StringIO()
    console = Console(file=out, width=300)  # a file: not a terminal
    progress = deploy_progress(console)
    assert isinstance(progress, PlainProgress)
    hosts = [f"gpu{i:02d}" for i in range(1, 5)]
    failed = {"msg": "No package matching 'nvidia-driver=570' is available\n[see apt]"}
    with progress:
        progress.stage("preflight", hosts)
        for host in hosts:
            progress.event(_event("runner_on_start", host, task="Check the clock"))
            progress.event(_event("runner_on_ok", host, task="Check the clock", res={}))
        progress.stage("provision", hosts)
        progress.event({"event": "playbook_on_task_start", "event_data": {"task": "Install"}})
        progress.event(_event("runner_on_failed", "gpu02", task="Probe", ignore_errors=True))
        progress.event(_event("runner_on_failed", "gpu03", task="Install the driver", res=failed))
        progress.event(_event("runner_on_failed", "gpu03", task="Install again", res=failed))
        progress.event(_event("runner_on_unreachable", "gpu04", task="Gather", res={"msg": "x"}))
        progress.stage("validate", ["gpu01", "gpu02"])
    lines = out.getvalue().splitlines()
    stamp = r"\d\d:\d\d:\d\d "
    assert len(lines) == 5, lines
    assert re.fullmatch(stamp + r"preflight: 4 hosts", lines[0])
    assert re.fullmatch(stamp + r"provision: 4 hosts \(preflight took \d+\.\d s\)", lines[1])
    assert re.fullmatch(
        stamp + r"provision: gpu03 failed: Install the driver: No package matching "
        r"'nvidia-driver=570' is available \[see apt\]",
        lines[2],
    )
    assert re.fullmatch(stamp + r"provision: gpu04 unreachable: Gather: x", lines[3])
    assert re.fullmatch(stamp + r"validate: 2 hosts \(provision took \d+\.\d s\)", lines[4])
    assert "\x1b" not in out.getvalue()
