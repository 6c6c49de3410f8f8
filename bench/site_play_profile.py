"""Where a converged site play's time goes: host-tasks per role and per task, local or remote.

Not a test and not part of ``make bench``: the tool that found what docs/scaleout.md lists.
Runs ``playbooks/site.yml`` once with gpuforge's defaults on a lab that is up and converged
(``LAB``, default ``d2perf``; see bench/site_play_bench.py) and prints:

- wall time, controller CPU and host-tasks of the run (as the bench counts them: every task
  result, a loop's items instead of its summary);
- per role: host-tasks, how many were skipped, and how many never left the controller
  (``assert``, ``set_fact``, includes, ... and every skipped task). On this machine a converged
  task costs the controller about as much CPU whether or not it reaches the node (a worker
  process forked per host-task, its templates compiled), so these are the ones to merge away;
- the tasks, most host-tasks first, with their summed node-side durations.

    .venv/bin/python bench/site_play_profile.py [--top N]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from site_play_bench import RESULT_EVENTS  # the bench's own count of host-tasks

REPO = Path(__file__).resolve().parents[1]
LAB = os.environ.get("LAB", "d2perf")
#: Actions that run on the controller only (no module on the node).
LOCAL_ACTIONS = frozenset(
    f"ansible.builtin.{a}"
    for a in (
        "assert",
        "set_fact",
        "debug",
        "fail",
        "include_role",
        "include_tasks",
        "include_vars",
        "validate_argument_spec",
        "meta",
    )
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=40, help="tasks listed (default 40)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from gpuforge.lab import lifecycle  # noqa: PLC0415
    from gpuforge.playbook import run_playbook  # noqa: PLC0415

    if not (lifecycle.state_dir(LAB) / "ansible.cfg").is_file():
        sys.stdout.write(f"site play profile: lab {LAB} is not up (bench/site_play_bench.py)\n")
        return 0
    os.environ["ANSIBLE_CONFIG"] = str(lifecycle.state_dir(LAB) / "ansible.cfg")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    count: collections.Counter[tuple[str, str, str]] = collections.Counter()
    skipped: collections.Counter[tuple[str, str, str]] = collections.Counter()
    node_s: dict[tuple[str, str, str], float] = collections.defaultdict(float)

    def on_event(event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        if event.get("event") not in RESULT_EVENTS or (data.get("res") or {}).get("results"):
            return
        key = (data.get("role") or "-", data.get("task_action") or "?", data.get("task") or "?")
        count[key] += 1
        skipped[key] += event["event"].endswith("skipped")
        node_s[key] += float(data.get("duration") or 0)

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    result = run_playbook(
        "site.yml", lifecycle.inventory_dir(LAB).sources, on_event=on_event, timeout_s=3600
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    cpu += me.ru_utime + me.ru_stime
    total = sum(count.values())
    local = sum(n for k, n in count.items() if k[1] in LOCAL_ACTIONS or skipped[k] == n)
    changed = sum(s.changed for s in result.hosts.values())
    out = sys.stdout.write
    out(
        f"site.yml on {LAB}: {result.status}, {changed} changed, {wall:.1f} s wall,"
        f" {cpu:.1f} s controller CPU, {total} host-tasks"
        f" ({1000 * cpu / max(total, 1):.1f} ms CPU each), {local} never left the controller\n\n"
    )
    roles: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for key, n in count.items():
        row = roles[key[0]]
        row[0] += n
        row[1] += skipped[key]
        row[2] += n if key[1] in LOCAL_ACTIONS or skipped[key] == n else 0
    out(f"{'role':16} {'host-tasks':>10} {'skipped':>8} {'local':>6}\n")
    for role, (n, skip, loc) in sorted(roles.items(), key=lambda r: -r[1][0]):
        out(f"{role:16} {n:10} {skip:8} {loc:6}\n")
    out(f"\n{'host-tasks':>10} {'skipped':>8} {'node s':>7}  role / action / task\n")
    for key, n in count.most_common(args.top):
        action = key[1].removeprefix("ansible.builtin.")
        out(f"{n:10} {skipped[key]:8} {node_s[key]:7.1f}  {key[0]} / {action} / {key[2]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
