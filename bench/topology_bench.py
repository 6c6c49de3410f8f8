"""Benchmark: load + expand + render of the large examples, and ansible-inventory on 100k.

Not a test: prints a table. Each measurement runs in a fresh subprocess so that peak memory
(ru_maxrss) belongs to that measurement alone, ``REPEAT`` times (environment, default 3); the
figures printed are the medians. Run with ``make bench``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "topologies"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")
TIMEOUT_S = 1800
REPEAT = int(os.environ.get("REPEAT", "3"))


def _child(spec: str, out: str) -> None:
    """In the subprocess: time load+expand+render+write, report JSON on stdout."""
    from gpuforge.generate import write_inventory  # noqa: PLC0415 - timed import
    from gpuforge.topology import load_spec  # noqa: PLC0415
    from gpuforge.topology.expand import expand  # noqa: PLC0415

    t0 = time.perf_counter()
    topo = load_spec(spec)
    t1 = time.perf_counter()
    cluster = expand(topo)
    t2 = time.perf_counter()
    write_inventory(cluster, out)
    t3 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "nodes": len(cluster.nodes),
        "links": len(cluster.links),
        "load_s": t1 - t0,
        "expand_s": t2 - t1,
        "render_s": t3 - t2,
        "total_s": t3 - t0,
        "cpu_s": sum(os.times()[:2]),
        "peak_mb": peak_mb,
    }
    sys.stdout.write(json.dumps(result) + "\n")


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _measure(spec: Path, out: Path) -> dict[str, float]:
    return _median([_measure_once(spec, out) for _ in range(REPEAT)])


def _measure_once(spec: Path, out: Path) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    data: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return data


def _ansible_inventory(inventory: Path, *args: str) -> tuple[float, float, int]:
    runs = [_ansible_inventory_once(inventory, *args) for _ in range(REPEAT)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        runs[0][2],
    )


def _ansible_inventory_once(inventory: Path, *args: str) -> tuple[float, float, int]:
    """One ``ansible-inventory`` call with ``args``: wall s, CPU s, hosts (0 unless --list)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(inventory), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=True,
        cwd=REPO,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hosts = len(json.loads(proc.stdout)["_meta"]["hostvars"]) if "--list" in args else 0
    return wall, cpu, hosts


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
        return 0
    load = os.getloadavg()[0]
    print(f"load average: {load:.1f} on {os.cpu_count()} CPUs; medians of {REPEAT} runs")  # noqa: T201
    header = f"{'spec':<18}{'nodes':>8}{'links':>9}{'load':>7}{'expand':>8}{'render':>8}"
    print(f"{header}{'total s':>9}{'cpu s':>7}{'peak MB':>9}")  # noqa: T201
    with tempfile.TemporaryDirectory(prefix="gpuforge-bench-") as tmp:
        for name in ("cluster-10k", "cluster-100k"):
            out = Path(tmp) / name
            r = _measure(EXAMPLES / f"{name}.yaml", out)
            print(  # noqa: T201
                f"{name:<18}{int(r['nodes']):>8,}{int(r['links']):>9,}{r['load_s']:>7.2f}"
                f"{r['expand_s']:>8.2f}{r['render_s']:>8.2f}{r['total_s']:>9.2f}"
                f"{r['cpu_s']:>7.2f}{r['peak_mb']:>9.0f}"
            )
        inventory = Path(tmp) / "cluster-100k"
        for args in (("--graph",), ("--list", "--export"), ("--list",)):
            wall, cpu, hosts = _ansible_inventory(inventory, *args)
            what = f"ansible-inventory {' '.join(args)}, cluster-100k"
            seen = f", {hosts:,} hosts" if hosts else ""
            print(f"{what:<48}{wall:>6.1f} s wall {cpu:>6.1f} s CPU{seen}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
