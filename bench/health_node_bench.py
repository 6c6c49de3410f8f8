"""Benchmark: the node checker's passive and prolog tiers on a simulated node (issue 16 item 8).

Not a test: prints figures. Builds ``gpuforge-node.pyz`` and runs it as slurmd would, one process
per run with the node's interpreter (``/usr/bin/python3 -I gpuforge-node.pyz health passive``),
against one lab-simulator node (8 H100s, 2 IB rails; ``nvidia-smi``, ``dmesg``, ``ibstat`` are
the simulator's, ``systemctl``/``dpkg-query`` small fakes, the sysfs counters files), with a
collector that is down (a refused connection: the common failure). Wall time per process and the
record's own ``duration_s``, median and p99 over ``RUNS`` (environment, default 100) runs each.

The lab's own figure (the same zipapp on a lab container, where the simulator's tools run in the
container) is helper D's lab bench; this one needs no containers. Run with ``make bench``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lab" / "sim"), str(ROOT / "src")]

from tests.unit.node.simnode import SimNode  # noqa: E402

from gpuforge.node import bundle  # noqa: E402

RUNS = int(os.environ.get("RUNS", "100"))
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(node: SimNode, pyz: Path, tier: str) -> tuple[list[float], list[float]]:
    env = node.env()
    env["GPUFORGE_NODE_PROC"] = str(node.proc)
    walls: list[float] = []
    inside: list[float] = []
    config = node.root / "health.yaml"
    for _ in range(RUNS):
        start = time.perf_counter()
        done = subprocess.run(
            [PYTHON, "-I", str(pyz), "health", tier, "--config", str(config), "--quiet"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"health {tier} exited {done.returncode}: {done.stderr.strip()}")
        record = json.loads((node.root / "state" / f"last-{tier}.json").read_text())
        inside.append(float(record["duration_s"]))
    return walls, inside


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpuforge-node-bench-") as tmp:
        root = Path(tmp)
        pyz = bundle.build(root / "dist")
        node = SimNode(root / "node")
        node.extra["collector"] = {"url": "http://127.0.0.1:9", "timeout_s": 2}
        node.extra["tiers"] = {"passive": {"timeout_s": 10}, "prolog": {"timeout_s": 2}}
        node.config()  # writes health.yaml
        say(f"node checker, {RUNS} runs per tier, {PYTHON} -I gpuforge-node.pyz (simulated node)")
        for tier in ("passive", "prolog"):
            walls, inside = measure(node, pyz, tier)
            say(
                f"  {tier:8s} process wall: median {statistics.median(walls):.3f} s, "
                f"p99 {_pct(walls, 0.99):.3f} s; record duration_s: median "
                f"{statistics.median(inside):.3f} s, p99 {_pct(inside, 0.99):.3f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
