"""Day 2 on one admitted lab: health checks drain, remediation brings back, RMA, breaker, operator.

One module-scoped lab (tests/integration/specs/day2.yaml, lab ``d2health``: hctl01 + hgpu01-04,
2 nodes per rack and per leaf, 2 rails) is brought up, deployed (phase 1, level quick) with a
HealthCheckInterval of 30 s. The deploy itself installs the day-2 control plane on the services
host hctl01 (the controller): the collector service the nodes' health.yaml points at, Prometheus and
Alertmanager, the conformance timer; no test starts a process of its own. Every day-2 test of the
project shares the lab (helpers add theirs below), so the costs of bringing it up are paid once.

What the loop must show (issue 16 item 7):
- an Xid 79 injected on hgpu03 drains it with ``gpuforge:gpu.xid:reboot`` within one interval
  (plus the collector's turn), ``gpuforge remediate --pending`` reboots it (a real container
  restart), the fault clears with the reboot, re-validation passes and the node is resumed;
- faults that never clear (``ib_port_down``) on both nodes of one leaf at once with a breaker of
  one node per leaf: one is drained (``gpuforge:fabric.port:inspect``), the other refused and the
  refusal recorded; remediation sends the drained one to RMA with an evidence bundle;
- hgpu04, drained by an operator before anything starts and given a fault of its own, keeps the
  operator's reason throughout.

Set GPUFORGE_KEEP_LAB=1 to leave the lab up after the module (debugging).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import upgrading
import yaml
from alerting import AlertLab, Scenario, fire_and_resolve, ib_port_down, rack_over_budget, xid79

from gpuforge.lab import lifecycle
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.slurm.control import SINFO_FORMAT, SinfoRow, parse_sinfo

# One module-scoped lab: every test of the module on one xdist worker (make test-lab).
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.xdist_group("day2")]

SPEC = Path(__file__).parent / "specs" / "day2.yaml"
LAB = "d2health"
CONTROLLER = "hctl01"
XID_NODE = "hgpu03"
OPERATOR_NODE = "hgpu04"
OPERATOR_REASON = "disk swap ticket 4711"
LEAF_PAIR = ("hgpu01", "hgpu02")  # one SU, so one leaf per rail
#: HealthCheckInterval of the lab (slurm.conf); the tests wait in multiples of it.
INTERVAL_S = 30
#: The deploy with monitoring and the services: 9 min on an idle 2-core machine, 21 min in a CI
#: run beside nine Molecule scenarios, past 30 min with other work on the machine.
DEPLOY_TIMEOUT_S = 2700
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
LOG = logging.getLogger(__name__)


# ---- the shared lab ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment every gpuforge call of this module runs with."""
    return dict(
        os.environ,
        CONTAINERS_CONF=str(CONTAINERS_CONF),
        ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(tmp_path_factory.mktemp("state")),
    )


run = upgrading.gpuforge


def on_services(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a command that must read the services host's records: without this
    module's own state directory, which would keep it on this machine (docs/health.md)."""
    return {k: v for k, v in env.items() if k != "GPUFORGE_STATE_DIR"}


def ssh(node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return upgrading.ssh(LAB, node, *argv, timeout=timeout)


@pytest.fixture(scope="module")
def lab(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The day-2 lab, deployed and admitted, with the operator's drain; yields its inventory."""
    lifecycle.down(LAB)
    try:
        proc = run(env, "lab", "up", str(SPEC), timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        inventory = lifecycle.state_dir(LAB) / "inventory"
        override = lifecycle.inventory_dir(LAB).site / "group_vars" / "all" / "zz-day2.yml"
        override.parent.mkdir(parents=True, exist_ok=True)
        override.write_text(
            "---\n"
            f"slurm_health_check_interval: {INTERVAL_S}\n"
            # the collector service's circuit breaker: one node per leaf per 10 minutes
            "gpuforge_services_max_fraction: 1\n"
            "gpuforge_services_max_per_leaf: 1\n"
            "gpuforge_services_window_s: 600\n"
        )
        reports = tmp_path_factory.mktemp("deploy")
        started = time.monotonic()
        proc = run(
            env,
            "deploy",
            "--phase",
            "1",
            "--level",
            "quick",
            str(SPEC),
            "--inventory",
            str(inventory),
            "--report-dir",
            str(reports),
            timeout=DEPLOY_TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        LOG.info("day-2 lab deployed in %.0f s", time.monotonic() - started)
        drain = ssh(
            CONTROLLER,
            "scontrol",
            "update",
            f"nodename={OPERATOR_NODE}",
            "state=drain",
            f"reason={OPERATOR_REASON}",
        )
        assert drain.returncode == 0, drain.stderr
        yield inventory
    finally:
        if not os.environ.get("GPUFORGE_KEEP_LAB"):
            lifecycle.down(LAB)


SERVICE = "gpuforge-collector.service"
#: Where the services host keeps the collector's state (roles/gpuforge_services defaults).
SERVICES_STATE = "/var/lib/gpuforge/state"
SERVICES_GPUFORGE = "/opt/gpuforge/venv/bin/gpuforge"


def _active(unit: str = SERVICE) -> bool:
    return ssh(CONTROLLER, "systemctl", "is-active", "--quiet", unit).returncode == 0


def _main_pid() -> int:
    proc = ssh(CONTROLLER, "systemctl", "show", "--property=MainPID", "--value", SERVICE)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip() or 0)


@pytest.fixture(scope="module")
def collector(lab: Path) -> Iterator[None]:
    """The collector the deploy runs on the services host (hctl01), as on any cluster: nobody
    starts it. Its breaker (one node per leaf per 10 min) comes from the lab's site layer."""
    wait_for(_active, 60, f"{SERVICE} to be active on {CONTROLLER}")
    yield
    journal = ssh(CONTROLLER, "journalctl", "--no-pager", "-u", SERVICE, "-n", "60")
    LOG.info("collector journal:\n%s", journal.stdout[-4000:])


# ---- helpers ----------------------------------------------------------------------------------

#: Faults active in the lab, by node: each injection writes them all (the file replaces the state;
#: faults already there keep their injection time).
_FAULTS: dict[str, list[dict[str, Any]]] = {}


def inject(env: dict[str, str], tmp: Path, node: str, *faults: dict[str, Any]) -> None:
    """Add ``faults`` to ``node`` in the running lab (``gpuforge lab faults``)."""
    _FAULTS.setdefault(node, []).extend(faults)
    doc = {
        "version": 1,
        "time_scale": 0.02,
        "faults": [{"node": n, **f} for n, fs in sorted(_FAULTS.items()) for f in fs],
    }
    path = tmp / f"faults-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = run(env, "lab", "faults", "--lab", LAB, str(path), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def sinfo() -> dict[str, SinfoRow]:
    proc = ssh(CONTROLLER, "sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}")
    assert proc.returncode == 0, proc.stderr
    return {row.node: row for row in parse_sinfo(proc.stdout)}


def wait_for(probe: Callable[[], Any], timeout: float, what: str, every: float = 3.0) -> Any:
    """The first truthy value of ``probe()`` within ``timeout`` seconds; fails the test else."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def drained(node: str) -> SinfoRow | None:
    row = sinfo()[node]
    return row if "drain" in row.state else None


def boot_mark(node: str) -> str:
    proc = ssh(node, "cut", "-d ", "-f22", "/proc/1/stat")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def remediate(
    env: dict[str, str], inventory: Path, reports: Path
) -> subprocess.CompletedProcess[str]:
    return run(
        env,
        "remediate",
        "--pending",
        "--inventory",
        str(inventory),
        "--report-dir",
        str(reports),
        "--gpu-burn-seconds",
        "10",
        "--dcgm-level",
        "2",
        "--json",
        timeout=1200,
    )


# ---- a rolling upgrade (issue 19), first, on the freshly admitted lab ---------------------------
#
# day2.yaml pins the lab mirror's older driver and NCCL; the upgrade moves the fleet to the newer
# pair with sleeping jobs on two nodes, is SIGKILLed in its second wave and re-run, and must leave
# the operator's node alone. It takes 10-16 min, so it is ``extended``: make test-integration runs
# it (and the health tests below then run on the upgraded nodes); the CI gate leaves it out.

NEW_PINS = {"nvidia_driver": "570.133.20", "nccl": "2.26.2"}
#: --max-fraction 0.5 of the partition's 32 GPUs: 2 nodes out at once, besides the operator's.
MAX_UPGRADING = 2


def test_incompatible_pins_are_refused_before_anything_runs(
    lab: Path, env: dict[str, str], tmp_path: Path
) -> None:
    bad = upgrading.spec_with(SPEC, tmp_path / "day2-bad.yaml", {"nvidia_driver": "570.86.10"})
    before = upgrading.states(LAB, CONTROLLER)
    proc = run(env, "upgrade", "run", str(bad), "--inventory", str(lab), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cuda-minimum-driver" in proc.stderr and "570.86.10" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert upgrading.states(LAB, CONTROLLER) == before
    assert upgrading.upgrade_record(env, SPEC) == {}


@pytest.mark.extended
def test_rolling_upgrade_keeps_jobs_capacity_and_the_operator_drain(
    lab: Path, env: dict[str, str], tmp_path: Path
) -> None:
    new = upgrading.spec_with(SPEC, tmp_path / "day2-new.yaml", NEW_PINS)
    # The roles install what the inventory pins: regenerate its generated layer from the new spec.
    proc = run(env, "inventory", "generate", str(new), "--output", str(lab), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = upgrading.submit_sleepers(LAB, CONTROLLER, (LEAF_PAIR[0], XID_NODE))
    args = [GPUFORGE, "upgrade", "run", str(new), "--inventory", str(lab), "--poll", "3"]
    args += ["--max-fraction", "0.5", "--report-dir", str(tmp_path)]
    started = time.monotonic()
    with upgrading.Sampler(LAB, CONTROLLER, ignore=frozenset({OPERATOR_NODE})) as sampler:
        upgrading.run_and_kill(args, env, new, tmp_path / "killed.log")
        second = subprocess.run(
            [*args, "--json"], env=env, capture_output=True, text=True, timeout=1800, check=False
        )
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    outcome = json.loads(second.stdout)
    assert outcome["status"] == "finished", outcome
    assert any("in flight" in n for n in outcome["notes"]), outcome["notes"]
    LOG.info("upgrade with a kill: %.0f s wall", time.monotonic() - started)
    # Capacity: never more nodes out at once than the limit allows (the operator's aside).
    assert len(sampler.samples) > 20
    worst = sampler.worst()
    assert 0 < len(worst) <= MAX_UPGRADING, worst
    # No job killed: each ran to the line it writes after its sleep.
    assert upgrading.unfinished_jobs(LAB, jobs) == {}
    # Every node on the new pins (asked of the nodes) but the operator's, which kept its drain.
    plan = run(env, "upgrade", "plan", str(new), "--inventory", str(lab), "--json", timeout=300)
    assert plan.returncode == 0, plan.stderr
    left = [s["node"] for w in json.loads(plan.stdout)["waves"] for s in w["steps"]]
    assert left == [OPERATOR_NODE], plan.stdout
    now = upgrading.states(LAB, CONTROLLER)
    assert now[OPERATOR_NODE][1] == OPERATOR_REASON, now
    upgraded = [n for n in now if n.startswith("hgpu") and n != OPERATOR_NODE]
    assert {n: now[n][0] for n in upgraded} == dict.fromkeys(upgraded, "idle"), now
    record = upgrading.upgrade_record(env, new)
    steps = {n["hostname"]: n["step"] for n in record["nodes"]}
    assert steps == {**dict.fromkeys(upgraded, "done"), OPERATOR_NODE: "skipped"}, steps
    upgrading.log_timings(record)


# ---- the loop ---------------------------------------------------------------------------------


def test_xid79_is_drained_remediated_by_a_reboot_and_resumed(
    lab: Path,
    collector: None,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    assert sinfo()[XID_NODE].state == "idle"
    before = boot_mark(XID_NODE)
    # the operator's node gets a fault too: it must not matter to gpuforge
    inject(env, tmp_path, OPERATOR_NODE, {"kind": "xid", "gpu": 0, "code": 79})
    injected = time.monotonic()
    inject(env, tmp_path, XID_NODE, {"kind": "xid", "gpu": 2, "code": 79})
    row = wait_for(lambda: drained(XID_NODE), INTERVAL_S * 2 + 30, f"{XID_NODE} to be drained")
    took = time.monotonic() - injected
    LOG.info("Xid 79 drained %s after %.0f s (interval %d s)", XID_NODE, took, INTERVAL_S)
    assert row.reason.startswith("gpuforge:gpu.xid:reboot"), row

    proc = remediate(env, lab, tmp_path / "reports")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert boot_mark(XID_NODE) != before, "remediation did not reboot the node"
    log = ssh(XID_NODE, "dmesg")
    assert "Xid" not in log.stdout, "the reboot did not clear the Xid 79 fault"
    assert sinfo()[XID_NODE].state in ("idle", "mixed", "allocated"), sinfo()[XID_NODE]
    _FAULTS.pop(XID_NODE)  # cleared by the reboot; the next file need not carry it


GPU_NODES = ("hgpu01", "hgpu02", "hgpu03", "hgpu04")
#: The node checker's spool of records the collector has not answered (health.yaml state_dir).
SPOOL = "/var/lib/gpuforge/health/spool"


def _spooled(node: str) -> int:
    proc = ssh(node, "sh", "-c", f"ls {SPOOL} 2>/dev/null | wc -l")
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip() or 0)


def _latest_passive(env: dict[str, str], lab: Path, node: str) -> dict[str, float]:
    """The node's newest passive record in the services host's history: its time and when the
    collector received it (unix seconds)."""
    proc = run(
        on_services(env), "health", "history", node, "--inventory", str(lab), "--json", timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(proc.stdout)["latest"]["passive"]
    return {
        k: datetime.fromisoformat(row[k].replace("Z", "+00:00")).timestamp()
        for k in ("at", "received")
    }


def _last_run(node: str) -> float:
    """When the node's newest passive run started, as the node itself recorded it."""
    proc = ssh(node, "cat", "/var/lib/gpuforge/health/last-passive.json")
    assert proc.returncode == 0, proc.stderr
    started = json.loads(proc.stdout)["started"]
    if isinstance(started, str):
        return datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    return float(started)


def test_collector_service_survives_sigkill_mid_burst_and_a_restart(
    lab: Path, collector: None, env: dict[str, str]
) -> None:
    """SIGKILL of the collector while every node posts: systemd starts it again, the nodes'
    spools drain at their next runs, each node's newest record is in the history, and a second
    collector started by hand beside the service is refused (one writer per history)."""
    killed = _main_pid()
    assert killed > 0
    burst = [
        subprocess.Popen(
            lifecycle.ssh_command(
                LAB,
                node,
                ["sh", "-c", "for i in 1 2 3 4 5 6; do /usr/local/sbin/gpuforge-healthcheck; done"],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in GPU_NODES
    ]
    time.sleep(1.5)
    kill = ssh(CONTROLLER, "kill", "-KILL", str(killed))
    assert kill.returncode == 0, kill.stderr
    for proc in burst:
        proc.wait(timeout=600)
    back = wait_for(
        lambda: _active() and _main_pid() not in (0, killed),
        60,
        "systemd to start the killed collector again",
        every=1,
    )
    assert back
    restarted = time.time()
    # the started collector takes records again (each node's next run, HealthCheckInterval), and
    # what the kill left in the spools goes with them
    wait_for(
        lambda: all(_latest_passive(env, lab, n)["received"] > restarted for n in GPU_NODES),
        INTERVAL_S * 2 + 30,
        "every node's record to reach the started collector",
    )
    wait_for(
        lambda: not any(_spooled(n) for n in GPU_NODES),
        INTERVAL_S * 2 + 30,
        "the nodes' spools to drain",
    )
    # nothing answered was lost: each node's newest run is in the history (read after the node)
    for node in GPU_NODES:
        last = _last_run(node)
        assert _latest_passive(env, lab, node)["at"] >= last - 1, node
    # one writer per history: a collector started by hand on the same state is refused
    second = ssh(
        CONTROLLER,
        "timeout",
        "30",
        SERVICES_GPUFORGE,
        "health",
        "serve",
        "--inventory",
        "/etc/gpuforge/cluster",
        "--state-dir",
        SERVICES_STATE,
        "--listen",
        "127.0.0.1:9498",
        timeout=60,
    )
    assert second.returncode == 2, (second.returncode, second.stdout, second.stderr)
    assert "Traceback" not in second.stderr
    # and a restart of the service is one too
    restart = ssh(CONTROLLER, "systemctl", "restart", SERVICE, timeout=120)
    assert restart.returncode == 0, restart.stderr
    assert _active()


def test_never_fault_on_a_whole_leaf_drains_one_and_goes_to_rma(
    lab: Path,
    collector: None,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    for node in LEAF_PAIR:
        _FAULTS.setdefault(node, []).append({"kind": "ib_port_down", "rail": 1})
    inject(env, tmp_path, LEAF_PAIR[0])
    # fabric.port fails after 2 runs in a row: two intervals, then the collector's turn
    wait_for(lambda: any(drained(n) for n in LEAF_PAIR), INTERVAL_S * 3 + 30, "a drain on the leaf")
    time.sleep(INTERVAL_S * 2)  # the other node has asked by now, and been refused
    rows = sinfo()
    out = [n for n in LEAF_PAIR if "drain" in rows[n].state]
    assert len(out) == 1, {n: rows[n] for n in LEAF_PAIR}
    (gone,) = out
    (kept,) = [n for n in LEAF_PAIR if n != gone]
    assert rows[gone].reason.startswith("gpuforge:fabric.port:inspect"), rows[gone]
    # read on the services host, where the collector keeps the history (found from the inventory)
    history = run(
        on_services(env), "health", "history", kept, "--inventory", str(lab), "--json", timeout=60
    )
    assert history.returncode == 0, history.stderr
    assert "refused" in history.stdout, history.stdout[-3000:]

    reports = tmp_path / "reports"
    proc = remediate(env, lab, reports)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]  # 1: went to RMA
    bundles = sorted((reports / LAB / "rma").glob(f"*{gone}*"))
    assert any(p.name.endswith(".tar.gz") for p in bundles), bundles
    manifest = json.loads(next(p for p in bundles if p.suffix == ".json").read_text())
    assert manifest["node"] == gone
    assert "drain" in sinfo()[gone].state  # still out: a hand is needed


def test_operator_drain_is_untouched_throughout(lab: Path, collector: None) -> None:
    row = sinfo()[OPERATOR_NODE]
    assert "drain" in row.state, row
    assert row.reason == OPERATOR_REASON, row


def test_conformance_runs_on_the_services_host_with_no_flags(
    lab: Path, collector: None, env: dict[str, str]
) -> None:
    """``make conformance``'s command, given only the cluster directory: it runs on the services
    host (found from the inventory, over SSH), its tasks post to the collector service there, and
    it judges the idle nodes (the operator's is skipped)."""
    proc = run(
        on_services(env),
        "conformance",
        "run",
        "--inventory",
        str(lab),
        "--level",
        "passive",
        "--window",
        "5",
        timeout=1200,
    )
    out = proc.stdout + proc.stderr
    LOG.info("conformance on the services host:\n%s", out[-3000:])
    assert "Traceback" not in out
    assert proc.returncode in (0, 1), out
    assert re.match(r"conformance run \d+ \(passive, ", proc.stdout), out
    passed = re.search(r"\bpass (\d+)", proc.stdout.splitlines()[0])
    assert passed and int(passed.group(1)) >= 1, out
    assert "judged no node" not in out


# ---- monitoring (issue 18): the right alert at the webhook sink, resolved when cleared ----------


@pytest.fixture(scope="module")
def alert_lab(lab: Path) -> AlertLab:
    """Exporters, Prometheus and Alertmanager (with the lab's webhook sink): the deploy's."""
    for unit in ("prometheus", "prometheus-alertmanager"):
        assert _active(unit), f"the deploy left {unit} inactive on {CONTROLLER}"
    return AlertLab(LAB, SPEC, CONTROLLER, time_scale=0.02)


@pytest.mark.parametrize(
    "scenario",
    [
        xid79(XID_NODE),
        ib_port_down(LEAF_PAIR[1], rail=0, device="mlx5_0"),
        # rack r002 holds hgpu03 and hgpu04; day2.yaml's budget is 12 kW per rack
        rack_over_budget("r002", (XID_NODE, OPERATOR_NODE)),
    ],
    ids=lambda s: s.alert,
)
def test_alert_reaches_the_sink_and_resolves(
    alert_lab: AlertLab, scenario: Scenario, tmp_path: Path
) -> None:
    """Active within a scrape and two evaluations, at the sink with labels and runbook, resolved."""
    took = fire_and_resolve(alert_lab, scenario, tmp_path)
    LOG.info("%s: %s", scenario.alert, {k: round(v) for k, v in took.items()})
