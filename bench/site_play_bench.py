"""Benchmark: the full site play on an already-converged lab, stock Ansible vs gpuforge's defaults.

Not a test: prints a table. Needs a lab that is up and converged (0 changed)::

    gpuforge lab up bench/specs/d2perf.yaml
    .venv/bin/python bench/site_play_bench.py --converge   # the first, changing run (minutes)
    .venv/bin/python bench/site_play_bench.py              # the measurement

Without that lab it prints why and exits 0 (``make bench`` runs everywhere). ``LAB`` (environment,
default ``d2perf``) names another lab; ``REPEAT`` (default 2) the runs per setting.

Both settings run ``playbooks/site.yml`` through gpuforge's own ansible-runner facade
(:func:`gpuforge.playbook.run_playbook`), each run in a fresh subprocess, **interleaved**
(stock, gpuforge, stock, gpuforge, ...) so that the load of a shared machine hits both alike:

- *stock*: Ansible's defaults: the ``linear`` strategy, 5 forks, ``gathering = implicit`` (facts
  gathered by every play), a memory fact cache, no pipelining, facts injected as ``ansible_*``
  variables. Only the lab's SSH options (its key, known_hosts, a control socket as Ansible's
  default ``ssh_args`` have) are kept.
- *gpuforge*: the lab's ``ansible.cfg`` (gathering smart with the jsonfile fact cache,
  pipelining, 16 forks, ``inject_facts_as_vars = false``) and the Mitogen strategy.

Controller CPU is the run's children's rusage (user + system: ansible-playbook, its forks, ssh
and Mitogen's brokers) plus the child's own (ansible-runner's event handling), divided by the
host-tasks the run executed (one per host per task result, skipped ones included: each costs the
controller a templating pass). The 12,500-node model built from that figure is in
docs/scaleout.md (section "Model of a full-fleet site play").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Where a lab's spec lives: the bench's own, else the integration tests'.
SPEC_DIRS = (Path("bench/specs"), Path("tests/integration/specs"))
LAB = os.environ.get("LAB", "d2perf")
REPEAT = int(os.environ.get("REPEAT", "2"))
TIMEOUT_S = 3600
FLEET = 12_500
# A converged fleet's execution host: the CPU cores its Ansible workers use for the play.
EXEC_HOST_CORES = int(os.environ.get("EXEC_HOST_CORES", "16"))
# What a real execution host achieves of its cores (SSH, Python start-up, the event stream back).
EXEC_EFFICIENCY = 0.7
KS = (1, 8, 32)
#: The events that are one host-task each (a loop's items, not its summary result).
RESULT_EVENTS = (
    "runner_on_ok",
    "runner_on_failed",
    "runner_on_skipped",
    "runner_on_unreachable",
    "runner_item_on_ok",
    "runner_item_on_skipped",
)

# Ansible's own defaults, stated explicitly so that an ansible.cfg cannot change them.
STOCK_ENV = {
    "ANSIBLE_STRATEGY": "linear",
    "ANSIBLE_FORKS": "5",
    "ANSIBLE_GATHERING": "implicit",
    "ANSIBLE_CACHE_PLUGIN": "memory",
    "ANSIBLE_PIPELINING": "False",
    "ANSIBLE_INJECT_FACT_VARS": "True",
}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _child(mode: str) -> None:
    """In the subprocess: one site play; report JSON on stdout."""
    from gpuforge.lab import lifecycle  # noqa: PLC0415 - the timed process imports it itself
    from gpuforge.playbook import run_playbook  # noqa: PLC0415

    host_tasks = 0

    def count(event: dict[str, Any]) -> None:
        nonlocal host_tasks
        data = event.get("event_data") or {}
        if event.get("event") in RESULT_EVENTS and not data.get("res", {}).get("results"):
            host_tasks += 1

    if mode.startswith("workers") or mode in ("controller", "exechosts"):
        _child_sharded(mode, count, lambda: host_tasks)
        return
    env: dict[str, str] = {}
    forks = 16
    if mode == "stock":
        env = dict(STOCK_ENV)
        forks = 5
    elif mode == "converge":
        mode = "gpuforge"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    result = run_playbook(
        "site.yml",
        lifecycle.inventory_dir(LAB).sources,
        forks=forks,
        env=env,
        on_event=count,
        timeout_s=TIMEOUT_S,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu += me.ru_utime + me.ru_stime
    out = {
        "mode": mode,
        # The facade reports its default; the stock run's environment overrode it.
        "strategy": env.get("ANSIBLE_STRATEGY", result.strategy),
        "status": result.status,
        "wall_s": wall,
        "cpu_s": cpu,
        "host_tasks": host_tasks,
        "hosts": len(result.hosts),
        "changed": sum(s.changed for s in result.hosts.values()),
        "failed": sorted(result.failed) + sorted(result.unreachable),
    }
    sys.stdout.write(json.dumps(out) + "\n")


def _child_sharded(mode: str, count: Any, host_tasks: Any) -> None:
    """In the subprocess: the site play on the GPU nodes only, one way of running it.

    ``workersN``: through the scale-out executor (:func:`gpuforge.execution.run_sharded`), one
    shard per SU, on N local workers (the same ansible-runner transmit / worker / process path
    an execution host runs); ``exechosts``: the same on the execution hosts the lab's site layer
    names (``gpuforge_execution_hosts``); ``controller``: one ``ansible-playbook`` on the
    controller (:func:`gpuforge.playbook.run_playbook`, gpuforge's defaults).
    """
    import tempfile  # noqa: PLC0415 - only this mode needs them

    from gpuforge.execution import (  # noqa: PLC0415
        local_hosts,
        run_sharded,
        shards,
    )
    from gpuforge.execution.executors import from_inventory  # noqa: PLC0415
    from gpuforge.inventory.reader import list_inventory, read_generated_hosts  # noqa: PLC0415
    from gpuforge.lab import lifecycle  # noqa: PLC0415
    from gpuforge.playbook import run_playbook  # noqa: PLC0415

    inv = lifecycle.inventory_dir(LAB)
    generated = read_generated_hosts(inv)
    infra = set(shards.infra_hosts(generated))
    gpu = sorted(h for h in shards.su_of(generated) if h not in infra)
    if mode == "exechosts":
        executors = from_inventory(list_inventory(inv.root))
    elif mode.startswith("workers"):
        executors = local_hosts(int(mode.removeprefix("workers")))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="site-play-bench-") as tmp:
        if mode == "controller":
            result = run_playbook(
                "site.yml",
                inv.sources,
                limit=",".join(gpu),
                artifact_dir=Path(tmp),
                on_event=count,
                timeout_s=TIMEOUT_S,
            )
            shard_count = 1
        else:
            sharded = run_sharded(
                "site.yml",
                inv,
                gpu,
                executors,
                artifact_dir=Path(tmp),
                on_event=count,
                timeout_s=TIMEOUT_S,
            )
            result = sharded.as_run_result()
            shard_count = len({a.shard for a in sharded.attempts})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    out = {
        "mode": mode,
        "strategy": result.strategy,
        "status": result.status,
        "wall_s": wall,
        "cpu_s": cpu + me.ru_utime + me.ru_stime,
        "host_tasks": host_tasks(),
        "hosts": len(result.hosts),
        "changed": sum(s.changed for s in result.hosts.values()),
        "failed": sorted(result.failed) + sorted(result.unreachable),
        "shards": shard_count,
    }
    sys.stdout.write(json.dumps(out) + "\n")


def _run(mode: str) -> dict[str, Any]:
    load = os.getloadavg()[0]
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
        check=False,
        cwd=REPO,
        # ansible-runner finds ansible-playbook on PATH: the one next to this interpreter.
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
    )
    if proc.returncode != 0:
        raise SystemExit(f"site play ({mode}) failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load"] = (load + os.getloadavg()[0]) / 2
    return result


def model(cpu_per_host_task: float, tasks_per_host: float, floor_s: float) -> dict[int, float]:
    """Predicted minutes of a converged site play on FLEET nodes with K execution hosts.

    Each execution host runs its shards with ``EXEC_HOST_CORES`` cores at ``EXEC_EFFICIENCY``;
    the CPU work is FLEET x tasks_per_host x cpu_per_host_task, split evenly over K hosts; a shard
    is never faster than ``floor_s``, the measured wall time of one small lab's play (the
    node-side latency of the tasks in sequence).
    """
    work = FLEET * tasks_per_host * cpu_per_host_task
    return {k: max(floor_s, work / (k * EXEC_HOST_CORES * EXEC_EFFICIENCY)) / 60 for k in KS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--child",
        choices=(
            "stock",
            "gpuforge",
            "converge",
            "workers1",
            "workers2",
            "controller",
            "exechosts",
        ),
    )
    parser.add_argument("--converge", action="store_true", help="converge the lab once first")
    parser.add_argument(
        "--scaleout",
        action="store_true",
        help="only the GPU nodes' play: one controller vs the lab's execution hosts",
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return 0
    sys.path.insert(0, str(REPO / "src"))
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    if not (lifecycle.state_dir(LAB) / "ansible.cfg").is_file():
        spec = next(
            (d / f"{LAB}.yaml" for d in SPEC_DIRS if (REPO / d / f"{LAB}.yaml").is_file()),
            Path("bench/specs") / f"{LAB}.yaml",
        )
        _say(
            f"site play bench: skipped, lab {LAB} is not up"
            f" (gpuforge lab up {spec}, then --converge)"
        )
        return 0
    os.environ["ANSIBLE_CONFIG"] = str(lifecycle.state_dir(LAB) / "ansible.cfg")
    if args.converge:
        _say(json.dumps(_run("converge")))
    if args.scaleout:
        _sharded()
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"stock": [], "gpuforge": []}
    for _ in range(REPEAT):
        for mode, done in runs.items():
            r = _run(mode)
            _say(
                f"  {mode:8} {r['strategy']:15} {r['wall_s']:7.1f} s wall {r['cpu_s']:7.1f} s CPU"
                f" {r['host_tasks']:5} host-tasks changed={r['changed']} load {r['load']:.0f}"
            )
            if r["failed"]:
                _say(f"    failed/unreachable: {', '.join(r['failed'])}")
            done.append(r)
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "host_tasks")}
        for m, rs in runs.items()
    }
    hosts = runs["gpuforge"][0]["hosts"]
    _say(f"\nFull site play, converged lab {LAB} ({hosts} nodes), median of {REPEAT} interleaved:")
    _say(f"  {'setting':10} {'wall s':>8} {'CPU s':>8} {'host-tasks':>10} {'CPU ms/host-task':>17}")
    for m, v in med.items():
        per = 1000 * v["cpu_s"] / v["host_tasks"]
        _say(f"  {m:10} {v['wall_s']:8.1f} {v['cpu_s']:8.1f} {v['host_tasks']:10.0f} {per:17.1f}")
    ratio = med["stock"]["wall_s"] / med["gpuforge"]["wall_s"]
    _say(f"  stock / gpuforge wall time: {ratio:.2f}x (goal >= 4x)")
    g = med["gpuforge"]
    per_task = g["cpu_s"] / g["host_tasks"]
    prediction = model(per_task, g["host_tasks"] / hosts, g["wall_s"])
    _say(
        f"\nModel: {FLEET} nodes, {g['host_tasks'] / hosts:.0f} host-tasks each,"
        f" {1000 * per_task:.1f} ms CPU per host-task, {EXEC_HOST_CORES} cores per execution host:"
    )
    for k, minutes in prediction.items():
        _say(f"  K={k:2}  {minutes:7.1f} min{'  (goal <= 60)' if k == 32 else ''}")
    if os.environ.get("SHARDED", "1") != "0":
        _sharded()
    return 0


def _sharded() -> None:
    """The GPU nodes' site play, one way against another, interleaved.

    With execution hosts in the lab's site layer (``gpuforge_execution_hosts``, as the d2exec
    lab of tests/integration/test_scaleout.py has): one ``ansible-playbook`` on the controller
    vs one shard per SU streamed to those hosts. Without: one local execution slot vs two.
    """
    from gpuforge.execution.executors import from_inventory  # noqa: PLC0415
    from gpuforge.inventory.reader import list_inventory  # noqa: PLC0415
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    named = [e.name for e in from_inventory(list_inventory(lifecycle.inventory_dir(LAB).root))]
    modes = ("controller", "exechosts") if named else ("workers1", "workers2")
    labels = {
        "controller": "1 controller",
        "exechosts": f"{len(named)} execution hosts ({', '.join(named)})",
        "workers1": "1 execution slot (local)",
        "workers2": "2 execution slots (local)",
    }
    walls: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(REPEAT):
        for mode, done in walls.items():
            r = _run(mode)
            _say(
                f"  {labels[mode]}: {r['hosts']} GPU nodes in {r['shards']} shards"
                f" {r['wall_s']:7.1f} s wall {r['cpu_s']:7.1f} s controller CPU"
                f" {r['host_tasks']} host-tasks changed={r['changed']} load {r['load']:.1f}"
            )
            if r["failed"]:
                _say(f"    failed/unreachable: {', '.join(r['failed'])}")
            done.append(r["wall_s"])
    one, two = (statistics.median(walls[m]) for m in modes)
    _say(
        f"\nSite play on the GPU nodes of {LAB}, median of {REPEAT} interleaved:\n"
        f"  {labels[modes[0]]} {one:.1f} s, {labels[modes[1]]} {two:.1f} s: {one / two:.2f}x"
    )


if __name__ == "__main__":
    raise SystemExit(main())
