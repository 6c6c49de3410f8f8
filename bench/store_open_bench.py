"""How long opening a history database takes with the integrity check the database module runs.

``python bench/store_open_bench.py [MB] [DIR]`` builds a history database of about MB megabytes
(default 100) from collector-shaped records (bench/health_collector_bench.py's), then times, median
of 5 with a warm page cache: ``HistoryStore.open`` for writing and read-only (both run ``PRAGMA
quick_check``), and the two checks alone (``quick_check``, the full ``integrity_check``).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from health_collector_bench import T0, make_record

from gpuforge.history.store import HistoryStore

NODES = 12500


def build(path: Path, mb: float) -> int:
    """Ingest rounds of every node's record, verdicts flipping, until the file reaches ``mb``."""
    store = HistoryStore.open(path)
    rounds = 0
    try:
        while path.stat().st_size + _wal(path) < mb * 1e6:
            at = T0 + rounds * 3600
            verdict = ("pass", "warn", "fail")[rounds % 3]
            for start in range(0, NODES, 1000):
                batch = [
                    make_record(i, at, verdict=verdict, tick=rounds)
                    for i in range(start, min(NODES, start + 1000))
                ]
                store.ingest(batch, received=at)
            rounds += 1
    finally:
        store.close()
    return rounds


def _wal(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def timed(fn: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pragma(path: Path, name: str) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert conn.execute(f"PRAGMA {name}").fetchone()[0] == "ok"  # noqa: S101
    finally:
        conn.close()


def main() -> None:
    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 100.0
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="store-"))
    path = work / "history.db"
    rounds = build(path, mb) if not path.exists() else 0
    result = {
        "mb": round(path.stat().st_size / 1e6, 1),
        "rounds_built": rounds,
        "open_rw_s": timed(lambda: HistoryStore.open(path).close()),
        "open_readonly_s": timed(lambda: HistoryStore.open(path, readonly=True).close()),
        "quick_check_s": timed(lambda: pragma(path, "quick_check")),
        "integrity_check_s": timed(lambda: pragma(path, "integrity_check"), n=3),
    }
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    print(json.dumps(rounded))  # noqa: T201 - the bench's output


if __name__ == "__main__":
    main()
