"""One fault, one check name, one action, on every path that can see it (issue 31).

Each fault is injected through the lab simulator's fault file and every path that runs on a
node is run against it, without containers:

* acceptance ``quick``: the testinfra suite's GPU checks (``validators/test_gpu.py``, local
  backend, the simulator's ``nvidia-smi``/``dmesg`` first on PATH, as test_suite_sim.py);
* acceptance ``burnin``: ``burnin.dcgm_diag`` at ``-r 3`` and ``burnin.gpu_burn_check``, the
  pipeline's per-node burn-in, on the simulator's ``dcgmi``/``gpu_burn`` (:class:`SimRunner`);
* the node tiers ``passive`` and ``epilog`` as :func:`gpuforge.node.engine.run_tier` runs them
  on a :class:`SimNode`;
* nightly conformance's node side, ``gpuforge-node conformance --level burnin`` (passive checks
  + DCGM ``-r 2`` + drift) on the same SimNode.

Every path that fails a check for the fault must fail the checks :data:`FAULTS` names, under their
catalogue names (a ``[...]`` instance only where the catalogue uses one), with the same action,
and the verdict each path yields must drain with the same ``gpuforge:<check>:<action>`` action.
Where a path cannot see a fault (the epilog's ``-r 1`` runs no PCIe test) :data:`FAULTS` says so
and the test asserts that path reports nothing for it, rather than skipping it.

The per-fault gathering is ~90 s of simulator subprocesses: those tests are ``slow`` (``make
test-slow``); the IB counter tests (acceptance burn-in and the passive tier on one climbing port)
and the DCGM-cites-an-Xid rule run with the unit suite.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from simlab import SimRunner, cluster_info, run_gpu_suite, run_tool, state
from tests.unit.node.simnode import SimNode

from gpuforge.admission import parse_reason, verdict_reason
from gpuforge.node.__main__ import main as node_main
from gpuforge.node.record import checks_of, node_verdict
from gpuforge.validate import burnin, catalogue, pipeline
from gpuforge.validate.acceptance import SuiteRun, read_results
from gpuforge.validate.result import CheckResult, Level, NodeVerdict, Status, Verdict, decide
from gpuforge.validate.xid_catalogue import lookup

HOST = "gpu001"
PATHS = ("validate.quick", "validate.burnin", "node.passive", "node.epilog", "conformance")


@dataclass(frozen=True)
class Fault:
    """A fault file entry, the checks it must fail ``{catalogue name: action}`` and the checks
    a path that runs them cannot see here ``{path: {check: why}}`` (``*``: every check)."""

    entry: Mapping[str, Any]
    fails: Mapping[str, str]
    unseen: Mapping[str, Mapping[str, str]]


_XID79 = lookup(79).action.value
_XID48 = lookup(48).action.value
_R1 = "dcgmi diag -r 1 (the epilog's) runs the deployment tests only"
FAULTS: dict[str, Fault] = {
    "xid79": Fault(
        # A fatal Xid in the kernel log; the simulator's DCGM reports it from its memory test
        # ("Detected XID 79 for GPU 3"): the GPU fell off the bus, Xid 79's action either way.
        {"kind": "xid", "gpu": 3, "code": 79},
        {"gpu.xid": _XID79, "gpu.dcgm_diag": _XID79},
        {"node.epilog": {"gpu.dcgm_diag": _R1}},
    ),
    "dcgm": Fault(
        # A PCIe link trained down: DCGM's PCIe test (-r 2 and up) and gpu.pcie_link both see it.
        {"kind": "pcie_downtrained", "gpu": 2, "gen": 3, "width": 16},
        {"gpu.pcie_link": "inspect", "gpu.dcgm_diag": "inspect"},
        {"node.epilog": {"gpu.dcgm_diag": _R1}},
    ),
    "ecc": Fault(
        {"kind": "ecc_uncorrectable", "gpu": 2},
        {"gpu.ecc_uncorrectable": _XID48, "gpu.xid": _XID48, "gpu.dcgm_diag": _XID48},
        {"node.epilog": {"gpu.dcgm_diag": _R1}},
    ),
    "flap": Fault(
        {"kind": "link_flap", "rail": 0},
        {"fabric.flaps": "inspect"},
        {
            "validate.quick": {
                "*": "the suite's fabric tests take their rails from the inventory or "
                "/etc/gpuforge/expected/fabric.json: not run by this harness (the lab runs them)"
            }
        },
    ),
    "gpu_missing": Fault(
        {"kind": "gpu_missing", "gpu": 3},
        {
            "gpu.count": _XID79,
            "gpu.xid": _XID79,
            "gpu.nvlink": _XID79,
            # gpu-burn tests the GPUs it finds: 7 of 8 is a failure of its own
            "burnin.gpu_burn": catalogue.action("burnin.gpu_burn"),
        },
        {},
    ),
}
#: Checks a path runs at all (the catalogue's ``runs``), beside the ones this harness gathers.
_RUNS = {
    "validate.quick": "quick",
    "validate.burnin": "burnin",
    "node.passive": "passive",
    "node.epilog": "epilog",
    "conformance": catalogue.CONFORMANCE,
}


def _suite(tmp: Path, entry: Mapping[str, Any]) -> list[CheckResult]:
    """validators/test_gpu.py on the simulated node, as test_suite_sim.py runs it."""
    out = run_gpu_suite(tmp, [{"node": HOST, **entry}])
    # The suite names the node after the host it ran on; the verdict is this node's.
    return [CheckResult.from_dict({**r.to_dict(), "node": HOST}) for r in read_results(out)]


def _burnin(tmp: Path, entry: Mapping[str, Any]) -> list[CheckResult]:
    runner = SimRunner({HOST: state([{"node": HOST, **entry}], HOST, tmp)})
    out = burnin.dcgm_diag(runner, HOST, level=3)
    out += burnin.gpu_burn_check(runner, HOST, seconds=5, gpus=8)
    return out


def _conformance(node: SimNode, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[CheckResult]:
    node.config()
    (tmp / "expected" / "state").mkdir(parents=True)
    with monkeypatch.context() as m:
        for key, value in node.env().items():
            m.setenv(key, value)
        m.setenv("GPUFORGE_NODE_PROC", str(node.proc))
        out = tmp / "conformance.out"
        with out.open("w") as sink:
            m.setattr(sys, "stdout", sink)
            rc = node_main(
                ["conformance", "--level", "burnin", "--config", str(node.root / "health.yaml"),
                 "--expected-dir", str(tmp / "expected"), "--no-send"]
            )  # fmt: skip
    assert rc == 0
    raw = json.loads(out.read_text().strip().splitlines()[-1])
    return list(checks_of(raw))


@dataclass(frozen=True)
class Seen:
    """What one path reported for a fault: its failed checks and the node's verdict."""

    failed: dict[str, str]  # full check name -> action
    verdict: NodeVerdict


def _seen_results(results: Sequence[CheckResult]) -> Seen:
    failed = {r.check: r.action for r in results if r.status is Status.FAIL}
    return Seen(failed, decide(HOST, results))


def _seen_records(checks: Sequence[CheckResult], first: str | None = None) -> Seen:
    """A node record's checks, judged as the controller does (the check the node asked to be
    drained for named first)."""
    failed = {c.check: c.action for c in checks if c.status is Status.FAIL and not c.shadow}
    return Seen(failed, node_verdict(HOST, checks, first=first))


_CACHE: dict[str, dict[str, Seen]] = {}


@pytest.fixture(params=sorted(FAULTS))
def seen(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Fault, dict[str, Seen]]:
    """Every path's report of one fault (gathered once per fault for the module's tests)."""
    name: str = request.param
    fault = FAULTS[name]
    if name not in _CACHE:
        tmp = tmp_path_factory.mktemp(name)
        quick = _suite(_mk(tmp / "quick"), fault.entry)
        burn = _burnin(_mk(tmp / "burnin"), fault.entry)
        got = {"validate.quick": _seen_results(quick), "validate.burnin": _seen_results(burn)}
        # The pipeline's verdict: burn-in runs on a node quick did not quarantine.
        stopped = decide(HOST, quick).verdict is Verdict.QUARANTINE
        got["validate"] = _seen_results(quick if stopped else [*quick, *burn])
        for tier in ("passive", "epilog"):
            record = SimNode(tmp / tier, [fault.entry]).run(tier).record
            first = record.request.check if record.request else None
            got[f"node.{tier}"] = _seen_records(record.checks, first)
        node = SimNode(tmp / "conf", [fault.entry])
        got["conformance"] = _seen_records(_conformance(node, tmp / "conf", monkeypatch))
        _CACHE[name] = got
    return fault, _CACHE[name]


def _mk(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _expected(fault: Fault, path: str) -> dict[str, str]:
    """The fault's checks that ``path`` runs (the catalogue's ``runs``) and sees."""
    unseen = fault.unseen.get(path, {})
    where = _RUNS[path]
    return {
        c: a
        for c, a in fault.fails.items()
        if where in catalogue.BY_NAME[c].runs and c not in unseen and "*" not in unseen
    }


def _bare(name: str) -> str:
    """``name`` without its instance; an instance only on a check the catalogue gives one."""
    found = catalogue.spec(name)
    assert found is not None, f"{name} is not a catalogue check"
    if name != found.name:
        assert name.startswith(found.name + "["), f"{name}: not {found.name}[<instance>]"
    return found.name


@pytest.mark.slow
def test_every_path_fails_the_same_checks_by_their_catalogue_names(
    seen: tuple[Fault, dict[str, Seen]],
) -> None:
    fault, got = seen
    for path in PATHS:
        names = {_bare(c) for c in got[path].failed}
        assert names == set(_expected(fault, path)), (path, got[path].failed)


@pytest.mark.slow
def test_every_path_gives_each_check_the_same_action(seen: tuple[Fault, dict[str, Seen]]) -> None:
    fault, got = seen
    for path in PATHS:
        for check, action in got[path].failed.items():
            assert action == fault.fails[_bare(check)], (path, check, action)


@pytest.mark.slow
def test_a_path_that_cannot_see_the_fault_says_nothing_of_it(
    seen: tuple[Fault, dict[str, Seen]],
) -> None:
    """Stated, not skipped: a path that does not run (or here cannot see) the fault's checks
    fails none of them and does not quarantine the node."""
    fault, got = seen
    blind = [p for p in PATHS if not _expected(fault, p)]
    for path in blind:
        assert got[path].failed == {}, path
        assert got[path].verdict.verdict is not Verdict.QUARANTINE, path
    if fault.entry["kind"] == "link_flap":  # the one fault only the node tiers see here
        assert blind == ["validate.quick", "validate.burnin", "node.epilog"]


@pytest.mark.slow
def test_every_path_that_sees_it_drains_with_one_action(
    seen: tuple[Fault, dict[str, Seen]],
) -> None:
    """The verdict each path yields drains with ``gpuforge:<check>:<action>`` (Admission's
    reason): the same action everywhere, naming one of the fault's checks; paths that failed
    the same checks name the same one."""
    fault, got = seen
    reasons: dict[str, str] = {}
    for path in ("validate", "node.passive", "node.epilog", "conformance"):
        verdict = got[path].verdict
        if not got[path].failed:
            continue
        assert verdict.verdict is Verdict.QUARANTINE, (path, verdict)
        reason = verdict_reason(verdict, verdict.action or catalogue.DEFAULT_ACTION)
        parsed = parse_reason(reason)
        assert parsed is not None, reason
        assert _bare(parsed.check) in fault.fails, (path, reason)
        reasons[path] = reason
    assert reasons, "no path saw the fault"
    actions = {parse_reason(r).action for r in reasons.values()}  # type: ignore[union-attr]
    assert len(actions) == 1, reasons
    by_set: dict[frozenset[str], set[str]] = {}
    for path, reason in reasons.items():
        by_set.setdefault(frozenset(map(_bare, got[path].failed)), set()).add(reason)
    assert all(len(r) == 1 for r in by_set.values()), reasons


# --- a port whose error counters climb during validation --------------------------------------


class _CounterRunner(SimRunner):
    """SimRunner that also answers burn-in's counter read (``grep -H . /sys/class/infiniband/…``)
    from the simulator's sysfs tree at a simulated clock that burn-in's commands advance."""

    def __init__(self, states: Mapping[str, Path], scratch: Path, start: float) -> None:
        super().__init__(states)
        self.scratch = scratch
        self.clock = start

    def run(self, host: str, command: str, *, timeout: float) -> burnin.CommandResult:
        if command.startswith("grep -H . /sys/class/infiniband/"):
            top = self.scratch / f"sys-{self.clock:.0f}"
            done = run_tool(
                self.states[host], "gpuforge-sim-sysfs", "--root", str(top),
                env={"GPUFORGE_SIM_NOW": f"{self.clock:.0f}"},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            lines = []
            for path in command.split()[3:]:
                real = top / path.removeprefix("/sys/")
                lines.append(f"{path}:{real.read_text().strip()}")
            return burnin.CommandResult(host, command, 0, "\n".join(lines) + "\n", "", 0.0)
        out = super().run(host, command, timeout=timeout)
        self.clock += 1800.0  # a burn-in step takes simulated time, counters grow meanwhile
        return out


def test_a_port_whose_counters_climb_during_burnin_is_not_admitted(tmp_path: Path) -> None:
    """Active, full rate, DCGM and gpu-burn passing; rail 1's symbol errors climb under load:
    the acceptance levels' fabric.counters quarantines it with the node checker's action."""
    entry = {"node": HOST, "kind": "ib_errors", "rail": 1, "counter": "symbol_error"}
    states = {HOST: state([entry], HOST, tmp_path)}
    runner = _CounterRunner(states, tmp_path, time.time())
    devices = ["mlx5_0", "mlx5_1"]
    before = burnin.sample_counters(runner, HOST, devices, now=lambda: runner.clock)
    results = burnin.dcgm_diag(runner, HOST, level=3)
    results += burnin.gpu_burn_check(runner, HOST, seconds=5, gpus=8)
    after = burnin.sample_counters(runner, HOST, devices, now=lambda: runner.clock)
    maxima = catalogue.params("fabric.counters")["max"]
    results.append(burnin.counter_results(before, after, level=Level.BURNIN, maxima=maxima))
    failed = {r.check: r for r in results if r.status is Status.FAIL}
    assert list(failed) == ["fabric.counters"], [(r.check, r.status) for r in results]
    assert failed["fabric.counters"].action == catalogue.action("fabric.counters") == "inspect"
    assert "ib/mlx5_1/1/symbol_error +" in str(failed["fabric.counters"].measured)
    verdict = decide(HOST, results)
    assert verdict.verdict is Verdict.QUARANTINE
    assert verdict_reason(verdict, verdict.action) == "gpuforge:fabric.counters:inspect"


def _sim_counters(state_file: Path, scratch: Path, at: float) -> dict[tuple[str, str], int]:
    """The simulator's port error counters at ``at`` (its sysfs tree, as gpuforge-sim-sysfs
    writes it on a lab node): ``{(device, counter): value}``."""
    top = scratch / f"sys-{at:.0f}"
    done = run_tool(state_file, "gpuforge-sim-sysfs", "--root", str(top),
                    env={"GPUFORGE_SIM_NOW": f"{at:.0f}"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {
        (dev, name): int((top / f"class/infiniband/{dev}/ports/1/counters/{name}").read_text())
        for dev in ("mlx5_0", "mlx5_1")
        for name in catalogue.COUNTER_NAMES
    }


def test_the_passive_tier_drains_the_same_climbing_port_with_the_same_reason(
    tmp_path: Path,
) -> None:
    """The fault of the burn-in test above, on the node: passive's fabric.counters fails with the
    same name and action, and the controller drains it with the same reason."""
    entry = {"kind": "ib_errors", "rail": 1, "counter": "symbol_error"}
    node = SimNode(tmp_path / "node", [entry])
    node.only("fabric.counters")
    start = time.time()
    records = []
    for step in range(3):  # fail_after 2: the second failing run asks for the drain
        at = start + 1800.0 * step
        for (dev, name), value in _sim_counters(node.state_file, tmp_path, at).items():
            node.set_counter(dev, name, value)
        when = datetime.fromtimestamp(at, UTC)
        records.append(node.run(now=lambda when=when: when).record)
    got = records[-1].check("fabric.counters")
    assert got is not None
    assert (got.status, got.action) == (Status.FAIL, catalogue.action("fabric.counters"))
    assert "ib/mlx5_1/1/symbol_error +" in str(got.measured)
    assert records[-1].request is not None
    assert (records[-1].request.check, records[-1].request.action) == (
        "fabric.counters",
        "inspect",
    )
    verdict = node_verdict(HOST, records[-1].checks, first=records[-1].request.check)
    assert verdict_reason(verdict, verdict.action) == "gpuforge:fabric.counters:inspect"


@pytest.mark.parametrize(
    ("test", "said", "action"),
    [
        # DCGM_FR_XID_ERROR in the memory test: the GPU fell off the bus, as gpu.xid says
        ("GPU Memory", ["Detected XID 79 for GPU 3"], _XID79),
        ("GPU Memory", ["Detected 2 volatile double-bit ECC error(s) in GPU 2."], _XID48),
        # a weaker Xid never weakens the test's own action
        ("PCIe", ["Detected XID 13 for GPU 1"], "inspect"),
    ],
)
def test_a_dcgm_failure_citing_an_xid_takes_the_xids_action_as_gpu_xid_does(
    test: str, said: list[str], action: str
) -> None:
    assert catalogue.dcgm_action(test, said) == action


def _one_node_cluster(tmp: Path) -> pipeline.ClusterView:
    """A cluster directory with the simulated node and its two rails (lab/sim's cluster-info)."""
    rails = cluster_info()["nodes"][0]["rails"][:2]
    node = {
        "hostname": HOST,
        "role": "gpu",
        "rack": "r001",
        "su": 1,
        "phase": 1,
        "mgmt_address": "10.0.0.11",
        "rails": [
            [r["rail"], r["device"], r["netdev"], f"10.100.{r['rail']}.11/24", r["leaf"], 1]
            for r in rails
        ],
    }
    inv = tmp / "inv"
    (inv / "generated").mkdir(parents=True)
    (inv / "generated" / "hosts.yml").write_text('{"all": {}}\n', encoding="utf-8")
    (inv / "generated" / "topology.json").write_text(
        json.dumps({"nodes": [node], "fabric": {"rate_gbps": 400}}), encoding="utf-8"
    )
    node_type = {"name": "h100-sxm", "gpu_model": "H100-SXM-80GB", "gpus": 8, "nvswitch": True}
    return pipeline.ClusterView.load(
        inv, lambda _: {"_meta": {"hostvars": {HOST: {"gpu_node_type": node_type}}}}
    )


@pytest.mark.slow
def test_the_validation_pipeline_does_not_admit_a_port_whose_counters_climb(
    tmp_path: Path,
) -> None:
    """``gpuforge validate --level burnin``'s own run (pipeline.run_validation): the testinfra
    suite, DCGM, gpu-burn, all on the simulator, pass; rail 1's symbol errors climb meanwhile."""
    entry = {"kind": "ib_errors", "rail": 1, "counter": "symbol_error"}
    runner = _CounterRunner(
        {HOST: state([{"node": HOST, **entry}], HOST, tmp_path)}, tmp_path, time.time()
    )

    def run_suite(_inv: Path, hosts: Sequence[str], work: Path) -> SuiteRun:
        assert list(hosts) == [HOST]
        return SuiteRun(0, tuple(_suite(_mk(work / "suite"), entry)), "", ())

    opts = pipeline.ValidationOptions(
        level=Level.BURNIN, gpu_burn_seconds=5, dcgm_level=3, work_dir=tmp_path / "work"
    )
    deps = pipeline.ValidationDeps(runner=runner, run_suite=run_suite, clock=lambda: runner.clock)
    summary = pipeline.run_validation(_one_node_cluster(tmp_path), [HOST], opts, deps)
    verdict = decide(HOST, summary.results)
    assert verdict.verdict is Verdict.QUARANTINE, verdict
    assert verdict.reasons == ("fabric.counters",)
    assert verdict_reason(verdict, verdict.action) == "gpuforge:fabric.counters:inspect"
    ran = {catalogue.base(r.check) for r in summary.results if r.status is Status.PASS}
    assert {"gpu.count", "gpu.xid", "gpu.dcgm_diag", "burnin.gpu_burn"} <= ran
