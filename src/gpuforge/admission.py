"""The one path into Slurm: maintenance windows, admission of verdicts, drains and resumes.

Every automatic Slurm action of gpuforge (deploy, ``validate --drain``, health) goes through this
module; :mod:`gpuforge.slurm.control` holds the raw operations it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from gpuforge.slurm import control
from gpuforge.slurm.control import DEFAULT_TIMEOUT, SlurmClient


@contextmanager
def maintenance_window(
    slurm: SlurmClient, name: str, nodes: str | Iterable[str], *, timeout: float = DEFAULT_TIMEOUT
) -> Iterator[None]:
    """Open ``nodes`` to root's jobs only, in reservation ``name``; afterwards, put them back.

    For acceptance jobs on nodes that may be drained (quarantined earlier, repaired since): the
    nodes are resumed inside a maintenance reservation, and on the way out, whatever happened in
    between, each node drained before is drained again with its own reason, and the reservation
    is deleted. Deciding new states is the caller's job, after.
    """
    names = control.expand_nodes(nodes)
    before = control.node_states(slurm, names, timeout=timeout)
    try:
        control.reserve(slurm, name, names, timeout=timeout)
        control.resume(slurm, names, f"gpuforge: validating inside reservation {name}")
        yield
    finally:
        by_reason: dict[str, list[str]] = {}
        for state in before:
            if state.drained:
                reason = state.reason or "drained before validation"
                by_reason.setdefault(reason, []).append(state.name)
        for reason, hosts in sorted(by_reason.items()):
            control.drain(slurm, hosts, reason, timeout=timeout)
        control.release(slurm, name, timeout=timeout)
