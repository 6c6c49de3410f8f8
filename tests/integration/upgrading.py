"""A rolling upgrade of a live lab as a test drives it: new pins, sleeping jobs, a kill, samples.

Used by the day-2 lab test (test_day2.py, in ``make test``) and by test_upgrade.py (``make
test-integration``: the same on its own lab, and back). Each caller passes its lab's name and
controller; nothing here knows a hostname.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuforge.lab import lifecycle
from gpuforge.slurm.control import SINFO_FORMAT, parse_sinfo

GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
#: Slurm states (flags stripped) of a node that can run jobs.
IN_SERVICE = ("idle", "mixed", "allocated", "completing")
#: Each sleeping job's length: long enough that a drain must wait for it.
JOB_SLEEP_S = 90
LOG = logging.getLogger(__name__)


def spec_with(spec: Path, out: Path, versions: Mapping[str, str]) -> Path:
    """A copy of ``spec`` at ``out`` with ``versions`` pinned over its own."""
    doc = yaml.safe_load(spec.read_text())
    doc["versions"] = {**doc["versions"], **versions}
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def gpuforge(
    env: Mapping[str, str], *args: str, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUFORGE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env),
        check=False,
    )


def ssh(lab: str, node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        lifecycle.ssh_command(lab, node, list(argv)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def states(lab: str, controller: str) -> dict[str, tuple[str, str]]:
    """``sinfo`` on the controller: node -> (state, reason)."""
    proc = ssh(lab, controller, "sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}")
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return {r.node: (r.state, r.reason) for r in parse_sinfo(proc.stdout)}


def upgrade_record(env: Mapping[str, str], spec: Path) -> dict[str, Any]:
    """The newest upgrade in ``gpuforge status --json``, or {} when there is none."""
    proc = gpuforge(env, "status", str(spec), "--json", timeout=120)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    ups = json.loads(proc.stdout)["upgrades"]
    return dict(ups[0]) if ups else {}


class Sampler(threading.Thread):
    """``sinfo`` every 2 s during a run: the most nodes out of service at once, and which.

    ``ignore``: nodes out before the run began (an operator's drain), not the run's doing.
    """

    def __init__(self, lab: str, controller: str, ignore: frozenset[str] = frozenset()) -> None:
        super().__init__(daemon=True)
        self.lab, self.controller, self.ignore = lab, controller, ignore
        self.samples: list[dict[str, tuple[str, str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                self.samples.append(states(self.lab, self.controller))
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                continue  # the controller busy: a missing sample proves nothing either way

    def worst(self) -> dict[str, str]:
        """The largest set of nodes seen out of service at once (node -> state)."""
        outs = [
            {
                n: s
                for n, (s, _) in sample.items()
                if n not in self.ignore and s.rstrip("*~#!%$@^-") not in IN_SERVICE
            }
            for sample in self.samples
        ]
        return max(outs, key=len, default={})

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join(10)


def submit_sleepers(lab: str, controller: str, nodes: Sequence[str]) -> dict[str, str]:
    """One ``sbatch`` sleep job per node; returns node -> its output file (on that node)."""
    jobs = {}
    for node in nodes:
        out = f"/var/tmp/upgrade-job-{node}.out"  # on the node's disk: survives its reboot
        ssh(lab, node, "rm", "-f", out)
        wrap = f"echo started $(date +%s); sleep {JOB_SLEEP_S}; echo finished $(date +%s)"
        proc = ssh(lab, controller, "sbatch", "--parsable", "-w", node, "-o", out, "--wrap", wrap)
        if proc.returncode != 0:
            raise AssertionError(proc.stderr)
        jobs[node] = out
    return jobs


def unfinished_jobs(lab: str, jobs: Mapping[str, str]) -> dict[str, str]:
    """Jobs whose output lacks the line written after the sleep: node -> what it wrote."""
    texts = {node: ssh(lab, node, "cat", out).stdout for node, out in jobs.items()}
    return {n: t for n, t in texts.items() if "started" not in t or "finished" not in t}


def run_and_kill(args: Sequence[str], env: Mapping[str, str], spec: Path, log_path: Path) -> None:
    """Start ``args`` (an ``upgrade run``); SIGKILL it once a node of its second wave applies."""
    with log_path.open("w") as log:
        first = subprocess.Popen(
            list(args), env=dict(env), stdout=log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 1500
        while first.poll() is None and time.monotonic() < deadline:
            time.sleep(3)
            nodes = upgrade_record(env, spec).get("nodes", [])
            if any(n["wave"] >= 2 and n["step"] == "applying" for n in nodes):
                first.send_signal(signal.SIGKILL)
                first.wait(60)
                LOG.info("killed the first run at %s", [(n["hostname"], n["step"]) for n in nodes])
                return
        first.kill()
    raise AssertionError("the run ended before its second wave: " + log_path.read_text()[-4000:])


def log_timings(upgrade: Mapping[str, Any]) -> None:
    """Per-node and per-wave wall times of an upgrade record (docs/upgrades.md quotes them)."""
    for n in upgrade["nodes"]:
        LOG.info(
            "node %s wave %s: drain wait %.0fs, apply %.0fs, validate %.0fs, total %.0fs",
            n["hostname"],
            n["wave"],
            n["drained_s"] or 0,
            n["apply_s"] or 0,
            n["validate_s"] or 0,
            n["seconds"] or 0,
        )
    for w in upgrade["waves"]:
        LOG.info("wave %s %s: %ss", w["wave"], w["nodes"], w["seconds"])
