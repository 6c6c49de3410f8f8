"""Benchmark: nightly conformance at 12,500 nodes (issue 17 item 5).

Not a test: prints figures. A history database is filled with ``NIGHTS`` (default 30) nights of
a 12,500-node fleet (1% failing with drift, 0.5% errors, 3% busy), then one more night runs
through :func:`gpuforge.conformance.run.run` with a fake Slurm whose collector store hands back
12,500 real records (the node checker's format, about 2 kB each, built by
``gpuforge.node.drift``): every record parsed and validated, judged, firmware compared across the
node type, stored, compared with the previous night and written as JSON, JUnit and HTML. Printed:
sbatch calls, wall and CPU seconds of aggregation + report, the controller's work per node, peak
memory (RSS), the database size and a node's history latency (median and p99 over 200 reads).

``NODES`` and ``NIGHTS`` (environment) scale it; ``NIGHTS=365`` measures a year of history.
Run with ``make bench``.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuforge.conformance import report
from gpuforge.conformance.run import ConformanceDeps, ConformanceFleet, ConformanceOptions, run
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore
from gpuforge.node import drift
from gpuforge.node.record import Drift
from gpuforge.slurm.control import SlurmNode
from gpuforge.validate.result import CheckResult, Status

NODES = int(os.environ.get("NODES", "12500"))
NIGHTS = int(os.environ.get("NIGHTS", "30"))
T0 = 1_795_000_000.0
#: A check result names its node: NodeResult fills in its own for the empty one.
FAILED = (CheckResult("", "conformance.drift", Status.FAIL, action="quarantine"),)
DRIFTED = (Drift("package", "libnccl2", "2.21.5-1", "2.25.1-1"),)
DAY = 86400.0


def say(text: str) -> None:
    """One line of the bench's output."""
    sys.stdout.write(text + "\n")


def names(n: int) -> list[str]:
    return [f"gpu{i:05d}" for i in range(1, n + 1)]


def passive_checks() -> list[CheckResult]:
    checks = [
        "gpu.count", "gpu.model", "gpu.xid", "gpu.ecc_uncorrectable", "gpu.row_remap",
        "gpu.nvlink", "gpu.pcie_link", "gpu.throttle", "fabric.port", "fabric.mtu",
        "fabric.counters", "fabric.flaps", "software.versions", "software.services",
    ]  # fmt: skip
    return [
        CheckResult("", c, Status.PASS, measured="ok", expected="ok", streak=12) for c in checks
    ]


def fill(
    history: ConformanceHistory, nodes: Sequence[str], nights: int, rng: random.Random
) -> None:
    for night in range(nights):
        run_ = history.begin("quick", len(nodes), at=T0 + night * DAY)
        rows = []
        for node in nodes:
            x = rng.random()
            if x < 0.01:
                rows.append(NodeResult(node, "fail", "conformance.drift", FAILED, DRIFTED))
            elif x < 0.015:
                rows.append(NodeResult(node, "error", "corrupt result"))
            elif x < 0.045:
                rows.append(NodeResult(node, "not_checked", "busy (ALLOCATED)"))
            else:
                rows.append(NodeResult(node, "pass"))
        history.add(run_.id, rows)
        history.finish(run_.id, "complete", at=T0 + night * DAY + 1800)


class FakeSlurm:
    """Slurm as the run sees it: states, one sbatch, the job gone after one look; records."""

    def __init__(self, nodes: Sequence[str], rng: random.Random) -> None:
        self.states = {
            n: SlurmNode(n, "ALLOCATED" if rng.random() < 0.03 else "IDLE") for n in nodes
        }
        self.submitted: list[list[str]] = []
        self.records: dict[str, str] = {}
        wrong = drift.DriftItem("package", "libnccl2", "2.21.5-1", "2.25.1-1")
        for n in nodes:
            bad = rng.random() < 0.01
            rec = drift.conformance_record(
                n, "quick", started="2026-12-18T01:30:00Z", duration_s=4.2,
                passive=passive_checks(),
                report=drift.DriftReport([wrong] if bad else [], roles=["nccl"], compared=40),
                firmware_versions={"vbios": "96.00.89.00.01", "hca/mlx5_0": "28.39.1002"},
                job_id="4242",
            )  # fmt: skip
            self.records[n] = json.dumps(rec)
        self.records[nodes[7]] = "{corrupt"

    def submit(self, argv: Sequence[str]) -> str:
        self.submitted.append(list(argv))
        return "4242"

    def collect(self, jobs: Sequence[str]) -> Mapping[str, Any]:  # noqa: ARG002 - one job
        return self.records


def main() -> int:
    rng = random.Random(17)  # noqa: S311 - a reproducible simulation
    nodes = names(NODES)
    placement = {
        n: report.Placement(
            f"su{i // 1024 + 1:02d}", f"r{i // 32 + 1:04d}", f"leaf{i // 32 + 1:04d}"
        )
        for i, n in enumerate(nodes)
    }
    fleet = ConformanceFleet(nodes, placement, dict.fromkeys(nodes, "h100-sxm"))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.db"
        history = ConformanceHistory(HistoryStore.open(db))
        t = time.perf_counter()
        fill(history, nodes, NIGHTS, rng)
        fill_s = time.perf_counter() - t
        slurm = FakeSlurm(nodes, rng)
        deps = ConformanceDeps(
            states=lambda: slurm.states,
            submit=slurm.submit,
            active=lambda _jobs: False,
            collect=slurm.collect,
            clock=lambda: T0 + NIGHTS * DAY,
            sleep=lambda _s: None,
        )
        cpu0 = time.process_time()
        t = time.perf_counter()
        outcome = run(
            fleet, history, ConformanceOptions(poll_s=0), deps, lock_path=Path(tmp) / "lock"
        )
        agg_s = time.perf_counter() - t
        t2 = time.perf_counter()
        paths = report.write(outcome.changes, Path(tmp) / "report")
        report_s = time.perf_counter() - t2
        cpu_s = time.process_time() - cpu0
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        lat = []
        for _ in range(200):
            node = rng.choice(nodes)
            t = time.perf_counter()
            history.node_history(node, limit=365)
            lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        size_mb = (
            db.stat().st_size
            + (Path(str(db) + "-wal").stat().st_size if Path(str(db) + "-wal").exists() else 0)
        ) / 1e6
        html_kb = paths["html"].stat().st_size / 1024
        counts = outcome.changes.counts()
    total = agg_s + report_s
    p99 = lat[int(len(lat) * 0.99) - 1]
    array = next(a for a in slurm.submitted[0] if a.startswith("--array="))
    say(f"conformance at {NODES} nodes, {NIGHTS} nights of history (filled in {fill_s:.1f} s)")
    say(f"  sbatch calls for {NODES} nodes: {len(slurm.submitted)} ({array})")
    say(f"  aggregation (parse, judge, firmware, store, compare): {agg_s:.2f} s")
    say(f"  report (JSON, JUnit, HTML {html_kb:.0f} kB): {report_s:.2f} s")
    say(
        f"  total {total:.2f} s wall, {cpu_s:.2f} CPU-s; controller work per node "
        f"{total / NODES * 1000:.3f} ms wall, {cpu_s / NODES * 1000:.3f} ms CPU; "
        f"peak RSS {rss_mb:.0f} MB"
    )
    say(f"  outcomes: {counts}")
    say(
        f"  history.db {size_mb:.1f} MB; node history (365 rows max) median "
        f"{statistics.median(lat):.2f} ms, p99 {p99:.2f} ms"
    )
    ok = total <= 30 and rss_mb <= 1024 and p99 <= 100
    say("  within budget (<= 30 s, <= 1 GB, node history <= 100 ms): " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
