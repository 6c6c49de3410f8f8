"""Simulated nccl-tests: all_reduce_perf, all_gather_perf, alltoall_perf, sendrecv_perf.

Single process (``-g N`` GPUs, ``-t`` threads) or one task per GPU/node under Slurm ``srun``
(SLURM_PROCID, SLURM_NTASKS, SLURM_NNODES, SLURM_JOB_NODELIST/SLURM_STEP_NODELIST,
SLURM_LOCALID). Rank 0 prints the report, as with real nccl-tests; the others print nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from . import SIM_BANNER
from .perf import Participant, busbw_at, collective_peak
from .state import (
    Lab,
    NodeView,
    SimError,
    expand_hostlist,
    load_lab,
    nccl_cuda_suffix,
    nccl_version,
)

COLLECTIVES = ("all_reduce", "all_gather", "alltoall", "sendrecv")
REDOP = {"all_reduce": "sum", "all_gather": "none", "alltoall": "none", "sendrecv": "sum"}
SOCKET_FALLBACK_BUSBW = 1.2  # NCCL NET/Socket over the management network, GB/s
NCCL_TESTS_VERSION = "2.13.13"

HEADER_COLS = (
    "#                                                              out-of-place"
    "                       in-place          \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
    "            (us)  (GB/s)  (GB/s)       "
)


@dataclass
class Args:
    minbytes: int = 32 * 1024 * 1024
    maxbytes: int = 32 * 1024 * 1024
    factor: int = 1
    stepbytes: int = 1024 * 1024
    nthreads: int = 1
    ngpus: int = 1
    iters: int = 20
    warmup: int = 5
    check: int = 1
    agg: int = 1
    graph: int = 0
    datatype: str = "float"
    op: str = "sum"
    root: int = 0


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGkmg]?)[Bb]?", text.strip())
    if not m:
        raise SimError(f"invalid size {text!r}", rc=1)
    mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]
    return int(m.group(1)) * mult


_SHORT = {
    "-b": "minbytes",
    "--minbytes": "minbytes",
    "-e": "maxbytes",
    "--maxbytes": "maxbytes",
    "-f": "factor",
    "--stepfactor": "factor",
    "-i": "stepbytes",
    "--stepbytes": "stepbytes",
    "-t": "nthreads",
    "--nthreads": "nthreads",
    "-g": "ngpus",
    "--ngpus": "ngpus",
    "-n": "iters",
    "--iters": "iters",
    "-w": "warmup_iters",
    "--warmup_iters": "warmup_iters",
    "-c": "check",
    "--check": "check",
    "-m": "agg",
    "--agg_iters": "agg",
    "-G": "graph",
    "--cudagraph": "graph",
    "-d": "datatype",
    "--datatype": "datatype",
    "-o": "op",
    "--op": "op",
    "-r": "root",
    "--root": "root",
    "-a": "average",
    "--average": "average",
    "-z": "blocking",
    "--blocking": "blocking",
    "-p": "parallel_init",
    "-N": "run_cycles",
    "-C": "report_cputime",
}

USAGE = """USAGE: {prog}
\t[-t,--nthreads <num threads>]
\t[-g,--ngpus <gpus per thread>]
\t[-b,--minbytes <min size in bytes>]
\t[-e,--maxbytes <max size in bytes>]
\t[-i,--stepbytes <increment size>]
\t[-f,--stepfactor <increment factor>]
\t[-n,--iters <iteration count>]
\t[-m,--agg_iters <aggregated iteration count>]
\t[-w,--warmup_iters <warmup iteration count>]
\t[-c,--check <0/1>]
\t[-d,--datatype <nccltype/all>]
\t[-o,--op <sum/prod/min/max/avg/all>]
\t[-r,--root <root>]
\t[-G,--cudagraph <num graph launches>]
\t[-h,--help]
nccl-tests {version} ({banner})
"""


def parse_args(prog: str, argv: list[str]) -> Args | None:  # noqa: PLR0912 - one branch per option
    a = Args()
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("-h", "--help"):
            print(USAGE.format(prog=prog, version=NCCL_TESTS_VERSION, banner=SIM_BANNER))
            return None
        key, val = tok, None
        if "=" in tok and tok.startswith("--"):
            key, val = tok.split("=", 1)
        name = _SHORT.get(key)
        if name is None:
            raise SimError(
                f"invalid option: {tok}\n"
                + USAGE.format(prog=prog, version=NCCL_TESTS_VERSION, banner=SIM_BANNER),
                rc=1,
            )
        if val is None:
            if i + 1 >= len(argv):
                raise SimError(f"option {tok} needs a value", rc=1)
            val = argv[i + 1]
            i += 1
        i += 1
        if name == "minbytes":
            a.minbytes = parse_size(val)
        elif name == "maxbytes":
            a.maxbytes = parse_size(val)
        elif name == "stepbytes":
            a.stepbytes = parse_size(val)
            a.factor = 1
        elif name == "factor":
            a.factor = int(val)
        elif name == "warmup_iters":
            a.warmup = int(val)
        elif name in ("nthreads", "ngpus", "iters", "check", "agg", "graph", "root"):
            setattr(a, name, int(val))
        elif name in ("datatype", "op"):
            setattr(a, name, val)
    a.maxbytes = max(a.maxbytes, a.minbytes)
    return a


def sizes(a: Args) -> list[int]:
    out = []
    s = a.minbytes
    while s <= a.maxbytes:
        out.append(s)
        nxt = s * a.factor if a.factor > 1 else s + a.stepbytes
        if nxt <= s:
            break
        s = nxt
    return out


@dataclass
class Job:
    rank0: bool
    my_node: str
    my_local: int  # local task index on my node
    nodes: list[str]
    tasks_per_node: int


def slurm_job(lab: Lab) -> Job:
    env = os.environ
    if "SLURM_PROCID" not in env:
        return Job(True, lab.hostname, 0, [lab.hostname], 1)
    procid = int(env["SLURM_PROCID"])
    ntasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or lab.hostname
    nodes = expand_hostlist(nodelist)
    nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or len(nodes))
    nodes = nodes[:nnodes]
    tpn = max(1, ntasks // max(1, len(nodes)))
    node_idx = min(procid // tpn, len(nodes) - 1)
    local = int(env.get("SLURM_LOCALID", procid % tpn))
    return Job(procid == 0, nodes[node_idx], local, nodes, tpn)


def _pid(host: str, rank: int) -> int:
    return 1000 + int(hashlib.sha256(f"{host}/{rank}".encode()).hexdigest()[:6], 16) % 900000


def node_failure(node: NodeView, first: int, count: int) -> str | None:
    """The CUDA error a task using GPUs [first, first+count) on ``node`` hits, if any."""
    if node.has("fabricmanager_down") and node.sku is not None and node.sku.nvswitch:
        return "system not yet initialized"
    if first + count > len(node.visible_gpus()):
        return "invalid device ordinal"
    return None


def run(coll: str, prog: str, argv: list[str]) -> int:  # noqa: PLR0912, PLR0915 - one report
    args = parse_args(prog, argv)
    if args is None:
        return 0
    lab = load_lab()
    job = slurm_job(lab)
    per_task = args.nthreads * args.ngpus
    # Any failure on my own node is reported by me, like the CUDA error of a real rank.
    me = lab.node(job.my_node)
    err = node_failure(me, job.my_local * per_task, per_task)
    if err is not None:
        print(f"{job.my_node}: Test CUDA failure common.cu:1279 '{err}'")
        print(
            f" .. {job.my_node} pid {_pid(job.my_node, job.my_local)}: Test failure common.cu:1193"
        )
        return 1
    version = nccl_version()
    if not job.rank0:
        lab.sleep(2.0)
        return 0
    parts: list[Participant] = []
    failed = False
    for host in job.nodes:
        node = lab.node(host)
        if node_failure(node, 0, job.tasks_per_node * per_task) is not None:
            failed = True
        vis = node.visible_gpus()
        parts.append(Participant(node, vis[: job.tasks_per_node * per_task]))
    nranks = len(job.nodes) * job.tasks_per_node * per_task
    multi = len(job.nodes) > 1
    peak = collective_peak(lab, coll, parts, os.environ.get("NCCL_IB_HCA"))
    if multi and peak <= 0:
        peak = SOCKET_FALLBACK_BUSBW
    print(
        f"# nThread {args.nthreads} nGpus {args.ngpus} minBytes {args.minbytes} "
        f"maxBytes {args.maxbytes} step: "
        + (f"{args.factor}(factor)" if args.factor > 1 else f"{args.stepbytes}(bytes)")
        + f" warmup iters: {args.warmup} iters: {args.iters} agg iters: {args.agg} "
        f"validation: {args.check} graph: {args.graph}"
    )
    print("#")
    print("# Using devices")
    rank = 0
    for p in parts:
        for t in range(job.tasks_per_node):
            for k in range(per_task):
                phys = p.gpus[t * per_task + k] if t * per_task + k < len(p.gpus) else 0
                dev = t * per_task + k
                print(
                    f"#  Rank {rank:2d} Group {0:2d} Pid {_pid(p.node.hostname, t):6d} on "
                    f"{p.node.hostname:>10s} device {dev:2d} [0000:{p.node.bus_id(phys):02x}:00] "
                    f"{p.node.sku.product_name if p.node.sku else 'unknown'}"
                )
                rank += 1
    if os.environ.get("NCCL_DEBUG", "").upper() in ("VERSION", "INFO", "TRACE"):
        print(f"NCCL version {version}+cuda{nccl_cuda_suffix()}")
    if failed:
        sys.stdout.flush()
        lab.sleep(5.0)
        return 1
    print("#")
    print(HEADER_COLS)
    n = max(nranks, 1)
    factor = {
        "all_reduce": 2.0 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "alltoall": (n - 1) / n,
        "sendrecv": 1.0,
    }[coll]
    if factor == 0:
        factor = 1.0
    lat = min(p.node.sku.small_latency_us for p in parts if p.node.sku) if parts else 12.0
    if multi:
        lat = lat * 2 + 3.0 * (len(job.nodes).bit_length())
    key = "/".join(job.nodes)
    rng = parts[0].node.rng("nccl", coll, key, nranks)
    total_bw = 0.0
    count_bw = 0
    elapsed = 0.0
    wrong = "      0" if args.check else "    N/A"
    for size in sizes(args):
        if coll in ("all_gather", "alltoall"):
            count = size // 4 // n
            nbytes = count * 4 * n
        else:
            count = size // 4
            nbytes = count * 4
        row = f"{nbytes:12d}  {count:12d}  {'float':>8s}  {REDOP[coll]:>6s}  {-1:6d}"
        for _place in range(2):
            bus_curve = busbw_at(peak, nbytes, multi) * (1.0 + rng.uniform(-0.012, 0.012))
            alg_curve = bus_curve / factor
            t_us = lat * (1.0 + rng.uniform(-0.03, 0.03))
            if alg_curve > 0 and nbytes > 0:
                t_us += nbytes / (alg_curve * 1e3)
            algbw = nbytes / t_us / 1e3 if t_us > 0 else 0.0
            busbw = algbw * factor
            total_bw += busbw
            count_bw += 1
            elapsed += t_us * (args.iters + args.warmup)
            if t_us >= 10000.0:
                ts = f"{t_us:7.0f}"
            elif t_us >= 100.0:
                ts = f"{t_us:7.1f}"
            else:
                ts = f"{t_us:7.2f}"
            row += f"  {ts}  {algbw:6.2f}  {busbw:6.2f}{wrong}"
        print(row)
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {total_bw / max(count_bw, 1):.3f} ")
    print("#")
    sys.stdout.flush()
    lab.sleep(elapsed / 1e6)
    return 0


def make_main(coll: str) -> Callable[[list[str]], int]:
    def _main(argv: list[str]) -> int:
        return run(coll, f"{coll}_perf", argv)

    return _main
