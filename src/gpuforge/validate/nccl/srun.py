"""Running nccl-tests: the node-local 8-GPU check and collectives across nodes with ``srun``.

:class:`SrunCollective` is the real ``run_collective`` of :mod:`.localize`: nccl-tests through
``srun`` on the Slurm controller, under a hard timeout.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hostlist

from gpuforge.command import CommandResult, CommandRunner
from gpuforge.errors import OperationError
from gpuforge.validate.nccl.localize import Group, RunCollective
from gpuforge.validate.parsers.nccl_tests import NcclTestsResult
from gpuforge.validate.parsers.nccl_tests import parse as parse_nccl
from gpuforge.validate.result import CheckResult, Level, Status


class CollectiveUnavailable(OperationError):  # noqa: N818 - a state, not a bug
    """The collective could not be started at all (controller unreachable, srun missing).

    Distinct from a collective that ran and was slow or hung: that is evidence against the nodes;
    this is evidence against nothing, and the nodes are held, not drained.
    """


def largest_busbw(result: NcclTestsResult) -> float:
    """busbw at the largest message size (the bandwidth-bound regime), best of both halves."""
    if not result.rows:
        return 0.0
    row = max(result.rows, key=lambda r: r.size_bytes)
    return max(row.out_of_place.busbw_gbps, row.in_place.busbw_gbps)


def judge_single_node(node: str, cmd: CommandResult, floor_gbs: float, *, gpus: int) -> CheckResult:
    """The 8-GPU all_reduce check of one node from its nccl-tests output."""
    check = "nccl.allreduce_nvlink"
    expected = f">= {floor_gbs:.1f} GB/s busbw on {gpus} GPUs, 0 wrong"
    base: dict[str, Any] = {"node": node, "check": check, "expected": expected, "level": Level.FULL}
    ev = cmd.evidence()
    if cmd.timed_out:
        return CheckResult(
            status=Status.FAIL,
            measured="hung",
            evidence=ev,
            duration_s=cmd.duration_s,
            message="all_reduce_perf did not finish in time (a hung collective is a failure)",
            **base,
        )
    if cmd.unreachable:
        return CheckResult(status=Status.ERROR, evidence=ev, message="unreachable", **base)
    try:
        res = parse_nccl(cmd.stdout)
    except Exception as exc:
        status = Status.FAIL if cmd.rc not in (0, None) else Status.ERROR
        return CheckResult(status=status, evidence=ev, message=f"unparsable: {exc}", **base)
    busbw = largest_busbw(res)
    if res.avg_busbw_gbps is None and cmd.rc in (0, None):
        # A cut capture, not a slow node: its largest row may be any size the run reached.
        return CheckResult(
            status=Status.ERROR,
            measured=round(busbw, 2),
            evidence=ev,
            duration_s=cmd.duration_s,
            message="no '# Avg bus bandwidth' line: the output is cut or the run did not end",
            **base,
        )
    problems = []
    if res.gpu_count and res.gpu_count != gpus:
        problems.append(f"ran on {res.gpu_count} GPUs")
    if res.wrong_total:
        problems.append(f"{res.wrong_total} wrong elements (data corruption)")
    if res.out_of_bounds_ok is False:
        problems.append("out-of-bounds values")
    if busbw < floor_gbs:
        problems.append(f"busbw {busbw:.1f} < {floor_gbs:.1f} GB/s")
    if cmd.rc not in (0, None):
        problems.append(f"exit status {cmd.rc}")
    return CheckResult(
        status=Status.FAIL if problems else Status.PASS,
        measured=round(busbw, 2),
        evidence=ev,
        duration_s=cmd.duration_s,
        message="; ".join(problems),
        **base,
    )


def single_node_command(*, gpus: int = 8, size: str = "8G", binary: str = "all_reduce_perf") -> str:
    """The node-local 8-GPU all_reduce (no MPI, no Slurm: the node may not be admitted yet)."""
    return f"{binary} -b 1G -e {size} -f 2 -g {gpus} -c 1 -n 20 -w 5"


@dataclass
class SrunCollective:
    """``run_collective`` for real: nccl-tests across nodes with ``srun`` on the controller.

    Nodes that are not admitted yet are drained, and Slurm will not schedule on them: pass the
    name of a maintenance reservation covering them (``scontrol create reservation
    flags=maint,ignore_jobs nodes=... users=root``).
    """

    runner: CommandRunner
    controller: str
    gpus: int = 8
    size: str = "8G"
    time_limit_min: int = 10
    reservation: str | None = None
    partition: str | None = None
    mpi: str | None = "pmix"
    binary: str = "all_reduce_perf"
    rail_devices: Mapping[int, str] = field(default_factory=dict)
    outputs: dict[Group, CommandResult] = field(default_factory=dict)

    def command(self, nodes: Sequence[str], rail: int | None = None) -> str:
        """The ``srun`` line for ``nodes``."""
        argv = [
            "srun",
            f"-N{len(nodes)}",
            "--ntasks-per-node=1",
            f"--gpus-per-node={self.gpus}",
            "-w",
            hostlist.collect_hostlist(list(nodes)),
            f"--time={self.time_limit_min}",
            "--exclusive",
        ]
        if self.mpi:
            argv.append(f"--mpi={self.mpi}")
        if self.reservation:
            argv.append(f"--reservation={self.reservation}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if rail is not None:
            argv.append(f"--export=ALL,NCCL_IB_HCA=={self.rail_devices.get(rail, f'mlx5_{rail}')}")
        argv += [self.binary, "-b", self.size, "-e", self.size, "-f", "2", "-g", str(self.gpus)]
        return shlex.join(argv)

    def __call__(self, nodes: Group, rail: int | None = None) -> float:
        """Run the collective on ``nodes``; a hang or a crash measures 0 GB/s."""
        cmd = self.command(nodes, rail)
        res = self.runner.run(self.controller, cmd, timeout=self.time_limit_min * 60 + 30)
        self.outputs[tuple(nodes)] = res
        if res.unreachable or res.rc == 127:
            raise CollectiveUnavailable(
                f"cannot run srun on {self.controller}: {res.evidence()[-500:]}"
            )
        if res.timed_out or not res.stdout.strip():
            return 0.0
        try:
            parsed = parse_nccl(res.stdout)
        except Exception:
            return 0.0
        # A run that died, was cut before its summary or corrupted data has not shown its
        # bandwidth: its largest row may be any size it reached before it stopped.
        if res.rc not in (0, None) or parsed.avg_busbw_gbps is None or parsed.wrong_total:
            return 0.0
        return largest_busbw(parsed)

    def for_rail(self, rail: int) -> RunCollective:
        """A ``run_collective`` bound to one rail."""
        return lambda nodes: self(nodes, rail)
