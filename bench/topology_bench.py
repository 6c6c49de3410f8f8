"""Benchmark: load + expand + render of the large examples, the two commands on 100k,
``topology check`` of a 200,000-node spec, and ansible-inventory on 100k.

Not a test: prints tables. Each measurement runs in a fresh subprocess so that peak memory
(ru_maxrss) belongs to that measurement alone, ``REPEAT`` times (environment, default 3); the
figures printed are the medians. Phases are CPU seconds of the process (``time.process_time``),
``total s`` its wall time, ``cpu s`` all its CPU (user + system) including the imports. Run with
``make bench``. The children import gpuforge with its bytecode cached, as an installed gpuforge
does (``PYTHONDONTWRITEBYTECODE`` is dropped for them and each tree is imported once first):
compiling every module again would add a third of a second to each command.

The 200,000-node spec (the most a spec may have, ``gpuforge.topology.check.MAX_NODES``) is
cluster-100k.yaml with 199,958 GPU nodes, written to a temporary directory: 1.6 million GPUs,
8 million links.

``BASELINE=<git ref>`` (environment) measures that commit's tree too (``git archive``), in the
same run, interleaved with this tree's (the machine may be shared and noisy: compare the ratio
of one run, not figures of two runs).
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

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "topologies"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")
TIMEOUT_S = 1800
REPEAT = int(os.environ.get("REPEAT", "3"))


CLI_RUNS = {
    "inventory generate": ("inventory", "generate", "{spec}", "-o", "{out}"),
    "topology check": ("topology", "check", "{spec}"),
}
#: Nodes of the large spec: MAX_NODES, the most gpuforge plans.
NODES_200K = 200_000


def spec_200k(into: Path) -> Path:
    """cluster-100k.yaml grown to 200,000 nodes (its 42 service nodes kept), written in ``into``."""
    data = yaml.safe_load((EXAMPLES / "cluster-100k.yaml").read_text(encoding="utf-8"))
    data["name"], data["domain"] = "c200k", "c200k.example.com"
    service = sum(g["count"] for g in data["node_groups"] if g["role"] != "gpu")
    for group in data["node_groups"]:
        if group["role"] == "gpu":
            group.update(count=NODES_200K - service, hostname="gpu{index:06d}")
    addressing = data["addressing"]  # /14s: 262,142 addresses each
    addressing["management"] = {"subnet": "10.0.0.0/14", "gateway": "10.0.0.1"}
    addressing["bmc"] = {"subnet": "10.4.0.0/14"}
    addressing["rails"] = [
        {"subnet": f"10.{100 + 4 * r}.0.0/14"} for r in range(len(addressing["rails"]))
    ]
    path = into / "cluster-200k.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _child(spec: str, out: str) -> None:
    """In the subprocess: time load+expand+render+write, report JSON on stdout."""
    import importlib  # noqa: PLC0415

    try:  # timed imports
        writer = importlib.import_module("gpuforge.generate")
    except ImportError:  # a BASELINE from before the generate step
        writer = importlib.import_module("gpuforge.inventory.render")
    from gpuforge.topology import load_spec  # noqa: PLC0415
    from gpuforge.topology.expand import expand  # noqa: PLC0415

    w0, c0 = time.perf_counter(), time.process_time()
    topo = load_spec(spec)
    c1 = time.process_time()
    cluster = expand(topo)
    c2 = time.process_time()
    writer.write_inventory(cluster, out)
    w3, c3 = time.perf_counter(), time.process_time()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "nodes": len(cluster.nodes),
        "links": len(cluster.links),
        "load_s": c1 - c0,
        "expand_s": c2 - c1,
        "render_s": c3 - c2,
        "total_s": w3 - w0,
        "cpu_s": sum(os.times()[:2]),
        "peak_mb": peak_mb,
    }
    sys.stdout.write(json.dumps(result) + "\n")


def _cli_child(argv: list[str]) -> None:
    """In the subprocess: one gpuforge command, as ``gpuforge ARGV`` runs it (imports included);
    its output is dropped, CPU seconds and peak memory reported as JSON on stdout."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415

    w0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from gpuforge.cli import main as cli  # noqa: PLC0415 - timed import

        cli.main(argv, prog_name="gpuforge", standalone_mode=False)
    result = {
        "total_s": time.perf_counter() - w0,
        "cpu_s": sum(os.times()[:2]),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    sys.stdout.write(json.dumps(result) + "\n")


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _measure(spec: Path, out: Path, trees: dict[str, Path | None]) -> dict[str, dict[str, float]]:
    """Medians per tree; the trees' runs interleave, so that a busy spell hits them alike."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(REPEAT):
        for name, src in reversed(trees.items()):  # this tree's last: ansible-inventory reads it
            runs[name].append(_run_child(["--child", str(spec), str(out)], src))
    return {name: _median(r) for name, r in runs.items()}


def _measure_cli(
    argv: tuple[str, ...], trees: dict[str, Path | None]
) -> dict[str, dict[str, float]]:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(REPEAT):
        for name, src in trees.items():
            runs[name].append(_run_child(["--cli", *argv], src))
    return {name: _median(r) for name, r in runs.items()}


def _env(src: Path | None) -> dict[str, str]:
    """The children's environment: gpuforge from ``src`` (None: this tree), bytecode cached."""
    root = REPO if src is None else src
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "lab/sim")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _compile(trees: dict[str, Path | None]) -> None:
    """Import each tree's commands once, so that its bytecode is cached before any timing."""
    for src in trees.values():
        subprocess.run(
            [sys.executable, "-c", "import gpuforge.cli.inventory, gpuforge.generate"],
            capture_output=True, timeout=TIMEOUT_S, check=True, env=_env(src), cwd=REPO,
        )  # fmt: skip


def _run_child(args: list[str], src: Path | None) -> dict[str, float]:
    """This file in a fresh interpreter, importing gpuforge from ``src`` (None: this tree)."""
    env = _env(src)
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
        env=env,
        cwd=REPO,
    )
    data: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return data


def _baseline(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` under ``into`` (git archive; nothing is checked out)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref],
        capture_output=True,
        timeout=120,
        check=True,
    )
    subprocess.run(
        ["tar", "-x", "-C", str(into)], input=archive.stdout, capture_output=True, timeout=120,
        check=True,
    )  # fmt: skip
    return into


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
    if len(sys.argv) > 2 and sys.argv[1] == "--cli":
        _cli_child(sys.argv[2:])
        return 0
    load = os.getloadavg()[0]
    ref = os.environ.get("BASELINE", "").strip()
    print(f"load average: {load:.1f} on {os.cpu_count()} CPUs; medians of {REPEAT} runs")  # noqa: T201
    with tempfile.TemporaryDirectory(prefix="gpuforge-bench-") as tmp:
        trees: dict[str, Path | None] = {"this tree": None}
        if ref:
            trees[ref] = _baseline(ref, Path(tmp) / "baseline")
        _compile(trees)
        header = f"{'spec':<18}{'tree':<12}{'nodes':>8}{'links':>9}{'load':>7}{'expand':>8}"
        print(f"{header}{'render':>8}{'total s':>9}{'cpu s':>7}{'peak MB':>9}")  # noqa: T201
        for name in ("cluster-10k", "cluster-100k"):
            out = Path(tmp) / name
            for tree, r in _measure(EXAMPLES / f"{name}.yaml", out, trees).items():
                print(  # noqa: T201
                    f"{name:<18}{tree[:11]:<12}{int(r['nodes']):>8,}{int(r['links']):>9,}"
                    f"{r['load_s']:>7.2f}{r['expand_s']:>8.2f}{r['render_s']:>8.2f}"
                    f"{r['total_s']:>9.2f}{r['cpu_s']:>7.2f}{r['peak_mb']:>9.0f}"
                )
        spec = EXAMPLES / "cluster-100k.yaml"
        head = f"{'gpuforge ...':<34}{'tree':<12}{'total s':>9}"
        print(f"{head}{'cpu s':>7}{'peak MB':>9}")  # noqa: T201
        runs = [(f"{what}, cluster-100k", spec, argv) for what, argv in CLI_RUNS.items()]
        runs.append(
            ("topology check, 200,000 nodes", spec_200k(Path(tmp)), CLI_RUNS["topology check"])
        )
        for what, path, argv in runs:
            args = tuple(a.format(spec=path, out=Path(tmp) / "cli") for a in argv)
            measured = _measure_cli(args, trees)
            for tree, r in measured.items():
                ratio = ""
                if ref and tree != ref:
                    ratio = f"  {r['cpu_s'] / measured[ref]['cpu_s']:.2f}x the CPU of {ref}"
                print(  # noqa: T201
                    f"{what:<34}{tree[:11]:<12}{r['total_s']:>9.2f}{r['cpu_s']:>7.2f}"
                    f"{r['peak_mb']:>9.0f}{ratio}"
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
