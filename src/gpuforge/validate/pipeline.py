"""One validation run: pick the nodes, run the tiers, decide, and (optionally) act in Slurm.

``quick`` is the testinfra acceptance suite; ``burnin`` adds DCGM diagnostics, gpu-burn and
ib_write_bw per rail; ``full`` adds NCCL acceptance (per node, then the multi-node plan with
culprit localization). Every dependency with side effects (the command runner, the suite, the
collective) is injected, so the whole pipeline runs in unit tests against fakes.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hostlist

from gpuforge import reach
from gpuforge.command import CommandRunner, SshRunner
from gpuforge.errors import InputError
from gpuforge.inventory.reader import ClusterView
from gpuforge.slurm.control import SlurmClient
from gpuforge.ssh import SshTarget
from gpuforge.validate import burnin, catalogue, nccl
from gpuforge.validate.acceptance import SuiteRun, run_suite
from gpuforge.validate.result import (
    BatchSummary,
    CheckResult,
    FabricFinding,
    Level,
    Verdict,
    decide,
)
from gpuforge.validate.thresholds import for_sku, nccl_net_floor_gbs
from gpuforge.validate.verdict import not_run, peer_results

_LEVELS = (Level.QUICK, Level.BURNIN, Level.FULL)


def fabric_node(view: ClusterView, name: str) -> nccl.FabricNode:
    """Leaves and devices of ``name``, for the NCCL plan."""
    rails = view.rails(name)
    return nccl.FabricNode(
        name, tuple(str(r["leaf"]) for r in rails), tuple(str(r["device"]) for r in rails)
    )


@dataclass
class ValidationOptions:
    """Knobs of a run (CLI flags)."""

    level: Level = Level.QUICK
    gpu_burn_seconds: int = 300
    dcgm_level: int = 3
    reservation: str | None = None
    work_dir: Path = Path("build/validate")
    parallel: int = 32
    #: check -> {node: value} of admitted nodes outside the batch (their last validation): they
    #: join the peer comparisons of those checks without being judged (``PEER_CHECKS``).
    peer_reference: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


#: The checks compared among peers; admitted nodes' values of these may join the comparison.
PEER_CHECKS = ("burnin.gpu_burn.min_gflops", "burnin.ib_write_bw.min", "nccl.allreduce_nvlink")


@dataclass
class ValidationDeps:
    """What a run talks to; tests pass fakes."""

    runner: CommandRunner
    run_suite: Callable[[Path, Sequence[str], Path], SuiteRun]
    collective: (
        Callable[
            [ClusterView, Sequence[str], ValidationOptions],
            tuple[list[CheckResult], list[FabricFinding], int],
        ]
        | None
    ) = None
    now: Callable[[], str] = field(
        default=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    )
    #: Seconds on a monotonic clock (the counters' window).
    clock: Callable[[], float] = time.monotonic
    #: Nodes whose sshd does not answer, with the reason (:mod:`gpuforge.reach`); they get one
    #: "unreachable" result instead of every check failing to connect.
    unreachable: Callable[[Sequence[str]], dict[str, str]] | None = None


def run_validation(
    view: ClusterView,
    hosts: Sequence[str],
    opts: ValidationOptions,
    deps: ValidationDeps,
    *,
    known_good: Sequence[str] = (),
) -> BatchSummary:
    """Run the tiers up to ``opts.level`` on ``hosts`` and decide every node.

    ``known_good``: admitted, idle nodes outside the batch (held in the batch's maintenance
    reservation by the caller) that ib_write_bw may pair a suspect with; they get no verdict.
    """
    started = deps.now()
    results: list[CheckResult] = []
    findings: list[FabricFinding] = []
    meta: dict[str, Any] = {"hosts": hostlist.collect_hostlist(list(hosts)), "floors": {}}
    fatal = ""

    silent = deps.unreachable(hosts) if deps.unreachable else {}
    for host, why in sorted(silent.items()):
        results += not_run([host], "node.unreachable", why)
    everyone, hosts = hosts, [h for h in hosts if h not in silent]
    suite = deps.run_suite(view.path, hosts, opts.work_dir) if hosts else None
    meta["acceptance_rc"] = suite.rc if suite else None
    if suite is not None:
        results += [r for r in suite.results if r.node in set(hosts)]
        seen = {r.node for r in suite.results}
        if not suite.results:
            fatal = f"acceptance suite produced no results (rc {suite.rc}): {suite.output[-800:]}"
        missing = [h for h in hosts if h not in seen]
        results += not_run(missing, "acceptance", "no result from suite")

    level = _LEVELS.index(opts.level)
    before: dict[str, burnin.CounterSample] = {}
    if level >= 1 and not fatal:
        eligible = _still_eligible(hosts, results)
        before = _sample_counters(view, eligible, opts, deps)
        results += _burnin(view, eligible, opts, deps, meta, known_good)
    if level >= 2 and not fatal:
        eligible = _still_eligible(hosts, results)
        node_results, multi_findings = _nccl(view, eligible, opts, deps, meta)
        results += node_results
        findings += multi_findings
    if before:
        # The node checker's fabric.counters, across burn-in and NCCL: a port whose error
        # counters climb under load is not admitted, however well it carried the traffic.
        after = _sample_counters(view, list(before), opts, deps)
        maxima = catalogue.params("fabric.counters")["max"]
        results += [
            burnin.counter_results(before[n], after[n], level=opts.level, maxima=maxima)
            for n in before
        ]
    meta["placement"] = view.placement(everyone)
    return BatchSummary.build(
        everyone,
        results,
        level=opts.level,
        findings=tuple(findings),
        started_at=started,
        finished_at=deps.now(),
        meta=meta,
        fatal=fatal,
    )


def _still_eligible(hosts: Sequence[str], results: Sequence[CheckResult]) -> list[str]:
    """Nodes that have not failed yet (a failed node is not worth hours of burn-in)."""
    return [h for h in hosts if decide(h, results).verdict is not Verdict.QUARANTINE]


def _sample_counters(
    view: ClusterView, nodes: Sequence[str], opts: ValidationOptions, deps: ValidationDeps
) -> dict[str, burnin.CounterSample]:
    """Each InfiniBand node's rail port counters now (RoCE ports are not judged by them)."""
    if str(view.topology.get("fabric", {}).get("kind") or "infiniband").lower() == "roce":
        return {}
    devices = {n: [str(r["device"]) for r in view.rails(n) if r.get("device")] for n in nodes}
    wanted = [n for n in nodes if devices[n]]
    if not wanted:
        return {}

    def one(node: str) -> burnin.CounterSample:
        # The node's sysfs root, as its health checker is configured (the health role's
        # health_sysfs_root): the kernel's /sys on a real node.
        root = str(view.hostvars(node).get("health_sysfs_root") or "/sys")
        return burnin.sample_counters(
            deps.runner, node, devices[node], now=deps.clock, sysfs_root=root
        )

    with ThreadPoolExecutor(max_workers=max(1, min(opts.parallel, len(wanted)))) as pool:
        return {s.node: s for s in pool.map(one, wanted)}


def _pmap(
    fn: Callable[[str], list[CheckResult]], nodes: Sequence[str], n: int
) -> list[CheckResult]:
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(n, len(nodes)))) as pool:
        return [r for rs in pool.map(fn, nodes) for r in rs]


def _burnin(  # noqa: PLR0917 - the run's context, passed down unchanged
    view: ClusterView,
    nodes: Sequence[str],
    opts: ValidationOptions,
    deps: ValidationDeps,
    meta: dict[str, Any],
    known_good: Sequence[str] = (),
) -> list[CheckResult]:
    def per_node(node: str) -> list[CheckResult]:
        nt = view.node_type(node)
        out = burnin.dcgm_diag(deps.runner, node, level=opts.dcgm_level)
        out += burnin.gpu_burn_check(
            deps.runner,
            node,
            seconds=opts.gpu_burn_seconds,
            gpus=int(nt.get("gpus") or 8),
            min_gflops=_gpu_burn_floor(nt),
        )
        return out

    results = _pmap(per_node, nodes, opts.parallel)
    results += _ib_write_bw(view, nodes, deps, known_good)
    gflops = {
        r.node: float(r.measured)
        for r in results
        if r.check == "burnin.gpu_burn.min_gflops" and isinstance(r.measured, int | float)
    }
    burn_floor = _gpu_burn_floor(view.node_type(nodes[0])) if nodes else None
    if burn_floor is not None:
        meta["floors"]["burnin.gpu_burn.min_gflops"] = burn_floor
    results += peer_results(
        "burnin.gpu_burn.min_gflops",
        gflops,
        unit="Gflop/s",
        floor=f"the SKU floor {burn_floor:g} Gflop/s" if burn_floor else "",
        reference=opts.peer_reference.get("burnin.gpu_burn.min_gflops"),
    )
    mins = burnin.node_min(results, "burnin.ib_write_bw[", "burnin.ib_write_bw.min")
    results += mins
    meta["floors"]["burnin.ib_write_bw.min"] = round(view.rate_gbps * 0.9, 1)
    results += peer_results(
        "burnin.ib_write_bw.min",
        {r.node: float(r.measured or 0) for r in mins},
        unit="Gb/s",
        floor=f"the floor {meta['floors']['burnin.ib_write_bw.min']:g} Gb/s",
        reference=opts.peer_reference.get("burnin.ib_write_bw.min"),
    )
    return results


def _gpu_burn_floor(node_type: Mapping[str, Any]) -> float | None:
    """The SKU's gpu-burn Gflop/s floor, None for a model without one (peers only)."""
    try:
        return for_sku(str(node_type.get("gpu_model") or "")).gpu_burn_min_gflops
    except InputError:
        return None


def _ib_write_bw(
    view: ClusterView, nodes: Sequence[str], deps: ValidationDeps, known_good: Sequence[str] = ()
) -> list[CheckResult]:
    partners = [n for n in known_good if n not in set(nodes)]
    if not nodes or len(nodes) + len(partners) < 2:
        return not_run(nodes, "burnin.ib_write_bw", "needs two nodes", Level.BURNIN)
    rails = {n: view.rails(n) for n in [*nodes, *partners]}
    address = {n: str(view.node(n).get("mgmt_address") or n) for n in rails}
    count = min(len(r) for r in rails.values())
    out: list[CheckResult] = []

    def run_pair(p: burnin.RailPair) -> burnin.PairResult:
        return burnin.ib_write_bw_pair(deps.runner, p)

    for rail in range(count):

        def make_pair(server: str, client: str, round_no: int, rail: int = rail) -> burnin.RailPair:
            return burnin.RailPair(
                rail,
                server,
                str(rails[server][rail]["device"]),
                address[server],
                client,
                str(rails[client][rail]["device"]),
                # a new port per rail and round: a server left over from a hung pair holds its own
                burnin.PERFTEST_PORT + 16 * rail + round_no,
            )

        out += burnin.ib_write_bw_rail(
            run_pair,
            nodes,
            rate_gbps=view.rate_gbps,
            make_pair=make_pair,
            references=[p for p in partners if len(rails[p]) > rail],
        )
    return out


def _nccl(
    view: ClusterView,
    nodes: Sequence[str],
    opts: ValidationOptions,
    deps: ValidationDeps,
    meta: dict[str, Any],
) -> tuple[list[CheckResult], list[FabricFinding]]:
    def per_node(node: str) -> list[CheckResult]:
        nt = view.node_type(node)
        gpus = int(nt.get("gpus") or 8)
        floor = for_sku(str(nt.get("gpu_model") or "")).nvlink_allreduce_floor_gbs
        cmd = deps.runner.run(node, nccl.single_node_command(gpus=gpus), timeout=900)
        return [nccl.judge_single_node(node, cmd, floor, gpus=gpus)]

    results = _pmap(per_node, nodes, opts.parallel)
    if nodes:
        sku = view.node_type(nodes[0]).get("gpu_model") or ""
        meta["floors"]["nccl.allreduce_nvlink"] = for_sku(str(sku)).nvlink_allreduce_floor_gbs
    busbw = {
        r.node: float(r.measured)
        for r in results
        if r.check == "nccl.allreduce_nvlink" and isinstance(r.measured, int | float)
    }
    nvlink_floor = meta["floors"].get("nccl.allreduce_nvlink")
    results += peer_results(
        "nccl.allreduce_nvlink",
        busbw,
        unit="GB/s",
        level=Level.FULL,
        floor=f"the SKU floor {nvlink_floor:g} GB/s" if nvlink_floor else "",
        reference=opts.peer_reference.get("nccl.allreduce_nvlink"),
    )
    ok = [n for n in nodes if decide(n, results).verdict is Verdict.ADMIT]
    if len(ok) < 2 or deps.collective is None:
        return results, []
    more, findings, runs = deps.collective(view, ok, opts)
    meta["nccl_multinode_runs"] = runs
    return results + list(more), list(findings)


def multinode_acceptance(
    view: ClusterView,
    nodes: Sequence[str],
    collective: nccl.SrunCollective,
) -> tuple[list[CheckResult], list[FabricFinding], int]:
    """The topology's multi-node plan, each failing test localized; returns runs used too."""
    fabric = [fabric_node(view, n) for n in nodes]
    leaf_of = {f.hostname: f.leaf_key for f in fabric}
    nics = min(len(f.leaves) for f in fabric)
    results: list[CheckResult] = []
    findings: list[FabricFinding] = []
    runs = 0
    all_rails_good: set[str] = set()  # known-good partners for all-rail tests
    for test in nccl.acceptance_plan(fabric):
        per_rail = test.rail is not None
        floor = nccl_net_floor_gbs(1 if per_rail else nics, view.rate_gbps)
        run: nccl.RunCollective = (
            collective.for_rail(test.rail) if test.rail is not None else collective
        )
        # A node good on all rails together may still be bad on one: rail tests start afresh.
        good = set() if per_rail else all_rails_good
        # A one-rail test crosses that rail's leaves only: localize to those switches.
        leaves = leaf_of if test.rail is None else {f.hostname: f.leaves[test.rail] for f in fabric}
        for group in test.groups:
            loc = nccl.Localizer(run, floor, leaves, good=set(good), rail=test.rail).localize(
                group, what=test.name
            )
            good |= set(loc.cleared)
            runs += loc.run_count
            findings += loc.findings
            results += nccl.localization_results(
                loc, check=f"nccl.multinode.{test.name}", floor_gbs=floor
            )
    findings = nccl.merge_findings(findings, nccl.FabricMap.build(fabric, view.topology))
    return results, findings, runs


def make_collective(
    runner: CommandRunner,
) -> Callable[
    [ClusterView, Sequence[str], ValidationOptions],
    tuple[list[CheckResult], list[FabricFinding], int],
]:
    """The real ``ValidationDeps.collective``: srun on the first controller."""

    def run(
        view: ClusterView, nodes: Sequence[str], opts: ValidationOptions
    ) -> tuple[list[CheckResult], list[FabricFinding], int]:
        coll = nccl.SrunCollective(
            runner,
            view.controller(),
            gpus=int(view.node_type(nodes[0]).get("gpus") or 8),
            reservation=opts.reservation,
            rail_devices={int(r["rail"]): str(r["device"]) for r in view.rails(nodes[0])},
        )
        try:
            return multinode_acceptance(view, nodes, coll)
        except nccl.CollectiveUnavailable as exc:
            return not_run(nodes, "nccl.multinode", str(exc), Level.FULL), [], 0

    return run


@dataclass
class Wiring:
    """The real collaborators of a run (the CLI's tests replace :func:`wire` with fakes)."""

    view: ClusterView
    deps: ValidationDeps
    slurm: SlurmClient | None


def _suite(inventory: Path, hosts: Sequence[str], work: Path) -> SuiteRun:
    return run_suite(inventory, hosts, work)


def wire(inventory: Path, *, need_slurm: bool = False) -> Wiring:
    """Build the real wiring from an inventory directory."""
    view = ClusterView.load(inventory)
    meta = view.inventory.get("_meta", {}).get("hostvars", {})
    runner = SshRunner({h: SshTarget.from_hostvars(h, v) for h, v in meta.items()})
    deps = ValidationDeps(
        runner=runner,
        run_suite=_suite,
        collective=make_collective(runner),
        unreachable=lambda hosts: reach.probe(reach.targets(meta, hosts)),
    )
    client = None
    if need_slurm:
        ctl = view.controller()
        client = SlurmClient.over_ssh(ctl, view.hostvars(ctl))
    return Wiring(view, deps, client)
