"""Benchmark: the health collector and history store at 12,500 nodes (issue 16 item 5).

Not a test: prints figures. Three measurements:

1. one 5-minute round through the real collector over HTTP: 12,500 records of the DAY2 format
   (17 checks, 56 counters, about 5 kB each) posted by a client in another process (32
   connections, keep-alive), each parsed by ``gpuforge.node.record``, checked against the node's
   address, group-committed to the store and answered; wall time, the collector process's CPU
   seconds, records/s;
2. a simulated day in the store: 288 rounds of 12,500 records (ingested in batches of 1,000, as
   the writer does) with a day's changes of a 12,500-node fleet (a failure an hour and its
   recovery, 2% of nodes flapping between pass and warn four times a day, counters moving on
   10% of nodes an hour, an Xid a failure); the file size after the day;
3. ``node_history`` at a year of data at the simulated day's rates (its verdict changes on the
   same 2% flapping nodes every day, its events, 30 days of snapshots): the latency of a
   node's history page (50 entries, the CLI's default), and of a flapping node's page, last 30
   days and whole year.

``NODES`` (environment, default 12500) scales every part; ``DAY_ROUNDS`` (default 288) shortens
the day for a quick look; ``PARTS`` (default ``round,day,year``) picks the parts (``round``: the
collector alone, a minute). Run with ``make bench``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from gpuforge.admission import Admission, AdmissionRecord
from gpuforge.health.collector import Collector, make_server
from gpuforge.health.decide import Decider
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import HistoryStore, iso
from gpuforge.slurm.control import SlurmClient

NODES = int(os.environ.get("NODES", "12500"))
DAY_ROUNDS = int(os.environ.get("DAY_ROUNDS", "288"))
PARTS = set(os.environ.get("PARTS", "round,day,year").split(","))
ROUND_S = 300.0
T0 = 1_795_000_000.0
CHECKS = (
    *("gpu.count", "gpu.model", "gpu.xid", "gpu.ecc_uncorrectable", "gpu.row_remap"),
    *("gpu.nvlink", "gpu.pcie_link", "gpu.throttle", "gpu.dcgm_diag", "fabric.port"),
    *("fabric.mtu", "fabric.counters", "fabric.flaps", "fabric.roce_pfc"),
    *("software.versions", "software.services", "conformance.drift"),
)
IB = ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards")
GPU = ("ecc_sbe_volatile", "ecc_dbe_volatile", "retired_pages")


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def make_record(i: int, at: float, *, verdict: str = "pass", tick: int = 0) -> dict[str, Any]:
    """A record as a node sends it: every check, counters of 8 rails and 8 GPUs."""
    checks = []
    for name in CHECKS:
        status = "pass"
        action = None
        if verdict == "fail" and name == "gpu.xid":
            status, action = "fail", "reboot"
        if verdict == "warn" and name == "fabric.counters":
            status, action = "warn", "monitor"
        checks.append(
            {
                "check": name,
                "status": status,
                "action": action,
                "measured": "8" if status == "pass" else "79@PCI:0000:91:00=reboot",
                "expected": "8",
                "detail": f"{name} as declared" if status == "pass" else f"{name} off",
                "evidence": "" if status == "pass" else "NVRM: Xid (PCI:0000:91:00): 79, " * 8,
                "shadow": False,
                "streak": 0 if status == "pass" else 1,
            }
        )
    counters: dict[str, int] = {}
    for rail in range(8):
        for c in IB:
            counters[f"ib/mlx5_{rail}/1/{c}"] = tick if (c == "symbol_error" and rail == 0) else 0
    for gpu in range(8):
        for c in GPU:
            counters[f"gpu/{gpu}/{c}"] = 0
    return {
        "schema": "gpuforge.record/1",
        "node": node_name(i),
        "tier": "passive",
        "level": None,
        "started": iso(at),
        "duration_s": 1.8,
        "job_id": None,
        "config_digest": "sha256:" + "0" * 64,
        "verdict": verdict,
        "checks": checks,
        "counters": counters,
        "events": (
            [{"time": iso(at - 30), "gpu": 3, "event": "xid", "code": 79, "detail": "fell off"}]
            if verdict == "fail"
            else []
        ),
        "drift": [],
        "request": None,
    }


_CLIENT = r"""
import http.client, json, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
bodies = [line.encode() for line in open(path)]
errors = []
def work(k):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for body in bodies[k::32]:
        conn.request("POST", "/v1/records", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse(); data = resp.read()
        if resp.status != 200: errors.append((resp.status, data[:200]))
threads = [threading.Thread(target=work, args=(k,)) for k in range(32)]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps({"errors": len(errors), "first": str(errors[:1])}))
"""


class _NoSlurm:
    """No record of the round carries a request: any Slurm call is a bench error."""

    def run(self, host: str, command: str, *, timeout: float) -> Any:  # noqa: ARG002
        raise AssertionError(f"the bench round called Slurm: {command}")


def bench_round(work: Path) -> dict[str, float]:
    """Part 1: one round of NODES records through the HTTP collector."""
    names = [node_name(i) for i in range(NODES)]
    fleet = Fleet("bench", tuple(names), dict.fromkeys(names, "127.0.0.1"), {}, {})
    store = HistoryStore.open(work / "round" / "history.db")
    admission = Admission(SlurmClient(_NoSlurm()), AdmissionRecord(work / "round" / "adm.db"))
    collector = Collector(fleet, store, Decider(admission, leaves={}), metrics_dir=None)
    collector.start()
    server = make_server(collector, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    bodies = work / "round.jsonl"
    with bodies.open("w") as out:
        for i in range(NODES):
            out.write(json.dumps(make_record(i, T0)) + "\n")
    size = bodies.stat().st_size / NODES
    cpu0, t0 = time.process_time(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CLIENT, str(server.server_address[1]), str(bodies)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    server.shutdown()
    server.server_close()
    collector.stop()
    stored = len(store.latest())
    store.close()
    result = json.loads(proc.stdout)
    if result["errors"] or stored != NODES:
        raise SystemExit(f"round failed: {result}, {stored} of {NODES} stored")
    return {"wall_s": wall, "cpu_s": cpu, "rps": NODES / wall, "record_bytes": size,
            "batches": collector._writer.batches}  # fmt: skip


def bench_day(work: Path) -> dict[str, float]:
    """Part 2: a simulated day in the store; the file size after it.

    Each node's record is ingested once an hour (staggered over the rounds), and in every round
    where its verdict changes: the records in between change nothing the store keeps (they
    replace the node's latest row in place), so the file grows exactly as under the full rate,
    whose cost part 1 measures.
    """
    rng = random.Random(16)  # noqa: S311 - a reproducible simulation
    path = work / "day" / "history.db"
    store = HistoryStore.open(path)
    failing: dict[int, int] = {}  # node -> round it recovers
    flappers = set(rng.sample(range(NODES), max(1, NODES // 50)))
    flap_rounds = {n: set(rng.sample(range(DAY_ROUNDS), min(8, DAY_ROUNDS))) for n in flappers}
    movers: set[int] = set()
    ticks: dict[int, int] = {}
    verdicts: dict[int, str] = {}
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    failures_per_round = NODES / 12500 / 12  # one failure an hour at 12,500 nodes
    owed = 0.0
    records = 0
    for r in range(DAY_ROUNDS):
        at = T0 + r * ROUND_S
        if r % 12 == 0:
            movers = set(rng.sample(range(NODES), max(1, NODES // 10)))
            for i in movers:
                ticks[i] = ticks.get(i, 0) + 1
        owed += failures_per_round
        while owed >= 1:
            owed -= 1
            failing[rng.randrange(NODES)] = r + 24  # repaired two hours later
        batch = []
        for i in range(NODES):
            verdict = "pass"
            if failing.get(i, -1) > r:
                verdict = "fail"
            elif i in flappers and r in flap_rounds[i]:
                verdict = "warn"
            if i % 12 != r % 12 and verdicts.get(i) == verdict:
                continue
            verdicts[i] = verdict
            batch.append(make_record(i, at, verdict=verdict, tick=ticks.get(i, 0)))
            if len(batch) == 1000:
                store.ingest(batch, received=at)
                records += len(batch)
                batch = []
        if batch:
            store.ingest(batch, received=at)
            records += len(batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    with store.transaction() as db:
        counts = {
            t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608 - our names
            for t in ("latest", "verdicts", "snapshots", "events")
        }
    store.close()  # the last connection checkpoints the WAL into the file
    return {"wall_s": wall, "cpu_s": cpu, "records": records,
            "mb": path.stat().st_size / 1e6, **counts}  # fmt: skip


def bench_year(work: Path, day: dict[str, float]) -> dict[str, float]:
    """Part 3: node_history latency in a store holding a year at the simulated day's rates.

    The day's verdict changes (beyond each node's first record) repeat every day of the year
    on the same flapping nodes, its events on random nodes; snapshots are kept 30 days.
    """
    rng = random.Random(17)  # noqa: S311 - a reproducible simulation
    path = work / "year" / "history.db"
    store = HistoryStore.open(path)
    year = 365 * 86400.0
    flappers = [node_name(i) for i in rng.sample(range(NODES), max(1, NODES // 50))]
    per_flapper = int((day["verdicts"] - NODES) * 365 / len(flappers))
    events_per_year = int(max(day["events"], 1) * 365)
    snapshots_kept = int(max(day["snapshots"] - NODES, 0) * 30)
    fail_rec = zlib.compress(json.dumps(make_record(0, T0, verdict="fail")).encode())
    snap = zlib.compress(json.dumps(make_record(0, T0)["counters"]).encode())
    t_build = time.perf_counter()
    rows = 0
    with store.transaction() as db:
        for name in flappers:
            db.executemany(
                "INSERT INTO verdicts (node, tier, at, verdict, previous, signature)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (name, "passive", T0 - rng.random() * year, "warn" if k % 2 else "pass",
                     "pass" if k % 2 else "warn", "fabric.counters=warn:monitor" if k % 2 else "")
                    for k in range(per_flapper)
                ],
            )  # fmt: skip
            rows += per_flapper
        db.executemany(
            "INSERT INTO verdicts (node, tier, at, verdict, previous, signature)"
            " VALUES (?, 'passive', ?, 'pass', NULL, '')",
            [(node_name(i), T0 - year) for i in range(NODES)],
        )
        db.execute(
            "INSERT INTO change_records (id, record) SELECT id, ? FROM verdicts", (fail_rec,)
        )
        db.executemany(
            "INSERT INTO events (at, node, kind, check_name, action, code, gpu, source, detail,"
            " data) VALUES (?, ?, 'xid', 'gpu.xid', 'reboot', 79, 3, 'node', 'fell off', '{}')",
            [(T0 - rng.random() * year, node_name(rng.randrange(NODES)))
             for _ in range(events_per_year)],
        )  # fmt: skip
        db.executemany(
            "INSERT INTO snapshots (node, at, tier, verdict, digest, counters)"
            " VALUES (?, ?, 'passive', 'pass', 'd', ?)",
            [
                (node_name(rng.randrange(NODES)), T0 - rng.random() * 30 * 86400, snap)
                for _ in range(snapshots_kept)
            ],
        )
        # Received when they were made (the collector's clock), as the store writes them.
        db.execute("UPDATE verdicts SET received = at")
        db.execute("UPDATE events SET received = at")
        rows += NODES + events_per_year
    build_s = time.perf_counter() - t_build
    built_mb = path.stat().st_size / 1e6
    t_prune = time.perf_counter()
    gone = store.prune(now=T0)  # the hourly prune, the first time over a whole year
    prune_s = time.perf_counter() - t_prune
    with store.transaction() as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        page = db.execute("PRAGMA page_size").fetchone()[0]
    store.close()

    def timed(fn: Any, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)
        return sorted(out)

    with HistoryStore.open(path) as s:
        plain = timed(lambda: s.node_history(node_name(rng.randrange(NODES)), limit=50), 200)
        flapper = timed(lambda: s.node_history(rng.choice(flappers), limit=50), 200)
        month = timed(lambda: s.node_history(rng.choice(flappers), since=T0 - 30 * 86400), 100)
        worst = timed(lambda: s.node_history(rng.choice(flappers)), 50)
    return {
        "build_s": build_s,
        "mb": built_mb,
        "live_mb": (pages - free) * page / 1e6,
        "prune_s": prune_s,
        "rolled_up": gone["rolled_up"],
        "rows": rows,
        "per_flapper": per_flapper,
        "snapshots": snapshots_kept,
        "flapper_p99_ms": flapper[int(len(flapper) * 0.99) - 1],
        "month_p50_ms": statistics.median(month),
        "month_p99_ms": month[int(len(month) * 0.99) - 1],
        "p50_ms": statistics.median(plain),
        "p99_ms": plain[int(len(plain) * 0.99) - 1],
        "heavy_p50_ms": statistics.median(worst),
        "heavy_p99_ms": worst[int(len(worst) * 0.99) - 1],
    }


def main() -> None:
    """Run the three parts and print their figures."""
    with tempfile.TemporaryDirectory(prefix="gpuforge-health-bench-") as tmp:
        work = Path(tmp)
        if "round" in PARTS:
            r = bench_round(work)
            print(  # noqa: T201 - the bench's output
                f"health collector, one round of {NODES} records over HTTP "
                f"({r['record_bytes'] / 1000:.1f} kB each): {r['wall_s']:.1f} s wall, "
                f"{r['cpu_s']:.1f} CPU-s in the collector, {r['rps']:.0f} records/s "
                f"({r['batches']:.0f} store batches; a round has {ROUND_S:.0f} s)"
            )
        if not PARTS & {"day", "year"}:
            return
        d = bench_day(work)
        print(  # noqa: T201 - the bench's output
            f"history store, a simulated day of {NODES} nodes ({DAY_ROUNDS} rounds; "
            f"{d['records']:.0f} records ingested: hourly and on change): {d['wall_s']:.0f} s "
            f"wall, {d['cpu_s']:.0f} CPU-s; file {d['mb']:.0f} MB (latest {d['latest']:.0f}, "
            f"changes {d['verdicts']:.0f}, snapshots {d['snapshots']:.0f}, "
            f"events {d['events']:.0f})"
        )
        if "year" not in PARTS:
            return
        y = bench_year(work, d)
        print(  # noqa: T201 - the bench's output
            f"history store, a year at that day's rates ({y['rows']:.0f} changes and events, "
            f"{y['snapshots']:.0f} snapshots of 30 days, {y['mb']:.0f} MB, built in "
            f"{y['build_s']:.0f} s; the prune rolled up {y['rolled_up']:.0f} pass/warn changes "
            f"older than 30 days in {y['prune_s']:.0f} s: {y['live_mb']:.0f} MB live, the rest "
            f"reused pages): node_history of a node (50 entries) p50 {y['p50_ms']:.1f} ms,"
            f" p99 {y['p99_ms']:.1f} ms; of a flapping node ({y['per_flapper']:.0f} changes a "
            f"year): 50 entries p99 {y['flapper_p99_ms']:.1f} ms, its last 30 days p50 "
            f"{y['month_p50_ms']:.1f} ms p99 {y['month_p99_ms']:.1f} ms, its whole year p50 "
            f"{y['heavy_p50_ms']:.0f} ms p99 {y['heavy_p99_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main()
