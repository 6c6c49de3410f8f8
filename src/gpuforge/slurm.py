"""Slurm node state operations: read node state, drain and resume with a recorded reason.

The rollout admits or holds nodes through these functions; ``gpuforge slurm`` exposes them on the
command line.  Every function takes a :class:`Runner`, so the same code runs ``scontrol`` locally
on a controller (:class:`LocalRunner`) or on a controller reached over SSH (:class:`SshRunner`).

Parsing is pure: :func:`parse_scontrol_nodes` and :func:`parse_sinfo` turn the text Slurm prints
into typed values.  We parse ``scontrol -o show node`` rather than ``--json`` because the text form
is identical from Slurm 20.11 to 24.x while the JSON schema changes with every data_parser version.

Operations are idempotent: draining a node already drained with the same reason, or resuming a
node that is not drained or down, issues no ``scontrol update`` and reports the node unchanged.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import hostlist

from gpuforge.errors import InputError, OperationError
from gpuforge.ssh import SshTarget

#: Seconds any single Slurm command may take before we give up on it.
DEFAULT_TIMEOUT = 60.0

#: Slurm appends ``[user@YYYY-MM-DDTHH:MM:SS]`` to a node's reason.
_REASON_SUFFIX = re.compile(r"\s*\[(?P<user>[^@\]\s]+)@(?P<time>[0-9T:\-]+)\]\s*$")
#: ``Key=`` at the start of a field; Slurm's keys are CamelCase (``CPUTot``, ``MCS_label``).
_KEY = re.compile(r"(?:^|(?<=\s))(?P<key>[A-Z][A-Za-z0-9_]*)=")
#: Free-text fields that may contain spaces and ``=``; they run to the end of their line.
_FREE_TEXT_KEYS = ("Reason", "Comment", "Extra")

#: Node state flags after which no new work lands on a node.
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})
#: Base states or flags that ``scontrol update State=RESUME`` clears.
RESUMABLE = frozenset({"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING"})


@dataclass(frozen=True)
class CommandResult:
    """What a runner returns: exit status and decoded output."""

    rc: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs a Slurm command somewhere and returns its result; must enforce ``timeout``."""

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """Run ``argv`` and return its exit status and output (never raise on rc != 0)."""
        ...


def _completed(cmd: Sequence[str], timeout: float) -> CommandResult:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, timeout=timeout, check=False, text=True
        )
    except FileNotFoundError as exc:
        raise OperationError(f"{cmd[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise OperationError(f"timed out after {timeout:.0f}s: {shlex.join(cmd)}") from exc
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class LocalRunner:
    """Runs commands on this machine (a controller or a login node)."""

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """Run ``argv`` locally with a timeout."""
        return _completed(argv, timeout)


@dataclass(frozen=True)
class SshRunner:
    """Runs commands on ``target`` through the ``ssh`` binary, in batch mode.

    :func:`ssh_runner_from_hostvars` builds one from the inventory's connection settings.
    """

    target: SshTarget
    connect_timeout: int = 10

    def command(self, argv: Sequence[str]) -> list[str]:
        """The full ``ssh`` command line that runs ``argv`` on the host."""
        return self.target.command(shlex.join(argv), connect_timeout=self.connect_timeout)

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """Run ``argv`` on the remote host with a timeout covering the connection too."""
        result = _completed(self.command(argv), timeout + self.connect_timeout)
        if result.rc == 255:
            raise OperationError(
                f"ssh to {self.target.address} failed: {result.stderr.strip()[-500:]}"
            )
        return result


def ssh_runner_from_hostvars(host: str, hostvars: Mapping[str, Any]) -> SshRunner:
    """Build an :class:`SshRunner` from a host's Ansible connection variables."""
    return SshRunner(SshTarget.from_hostvars(host, hostvars))


@dataclass(frozen=True)
class NodeState:
    """One node as ``scontrol show node`` reports it."""

    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    reason_user: str = ""
    reason_time: str = ""
    partitions: tuple[str, ...] = ()
    gres: str = ""
    cpus: int = 0
    cpus_alloc: int = 0
    real_memory_mb: int = 0
    version: str = ""
    fields: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def drained(self) -> bool:
        """True when the scheduler places no new work on the node."""
        return bool(DRAIN_FLAGS.intersection(self.flags)) or self.state in DRAIN_FLAGS

    @property
    def resumable(self) -> bool:
        """True when ``State=RESUME`` would change the node."""
        return bool(RESUMABLE.intersection((self.state, *self.flags)))

    @property
    def state_text(self) -> str:
        """The state as Slurm prints it: ``IDLE+DRAIN``."""
        return "+".join((self.state, *self.flags))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (without the raw field map)."""
        data = asdict(self)
        data.pop("fields")
        data["state_text"] = self.state_text
        data["drained"] = self.drained
        return data


def _split_fields(line: str) -> dict[str, str]:
    """Split one ``Key=value Key=value ...`` line; free-text keys run to the line end."""
    out: dict[str, str] = {}
    free_at = len(line)
    for key in _FREE_TEXT_KEYS:
        match = re.search(rf"(?:^|(?<=\s)){key}=", line)
        if match and match.start() < free_at:
            free_at = match.start()
    head, tail = line[:free_at], line[free_at:]
    matches = list(_KEY.finditer(head))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(head)
        out[match.group("key")] = head[match.end() : end].strip()
    if tail:
        key, _, value = tail.partition("=")
        out[key] = value.strip()
    return out


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _node_from_fields(fields: Mapping[str, str]) -> NodeState:
    state_parts = [part for part in fields.get("State", "UNKNOWN").split("+") if part]
    # ``IDLE*`` style markers appear in some versions; the flag carries the meaning.
    base = state_parts[0].rstrip("*~#!%$@^-") if state_parts else "UNKNOWN"
    reason = fields.get("Reason", "")
    user = when = ""
    suffix = _REASON_SUFFIX.search(reason)
    if suffix:
        user, when = suffix.group("user"), suffix.group("time")
        reason = reason[: suffix.start()].rstrip()
    if reason in ("(null)", "None"):
        reason = ""
    partitions = fields.get("Partitions", "")
    gres = fields.get("Gres", "")
    return NodeState(
        name=fields["NodeName"],
        state=base,
        flags=tuple(state_parts[1:]),
        reason=reason,
        reason_user=user,
        reason_time=when,
        partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
        gres="" if gres == "(null)" else gres,
        cpus=_int(fields.get("CPUTot")),
        cpus_alloc=_int(fields.get("CPUAlloc")),
        real_memory_mb=_int(fields.get("RealMemory")),
        version=fields.get("Version", ""),
        fields=dict(fields),
    )


def parse_scontrol_nodes(text: str) -> list[NodeState]:
    """Parse ``scontrol [-o] show node`` output (one-line or multi-line form) into nodes.

    Records start at a line beginning with ``NodeName=``; the multi-line form continues on
    indented lines.  Raises InputError on text that holds no node record but is not empty.
    """
    records: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("NodeName="):
            records.append(_split_fields(line))
        elif records:
            records[-1].update(_split_fields(line))
        elif line.startswith("No nodes in the system"):
            return []
        else:
            raise InputError(f"not scontrol node output: {line[:120]!r}")
    return [_node_from_fields(fields) for fields in records]


@dataclass(frozen=True)
class SinfoRow:
    """One row of :data:`SINFO_FORMAT` output: a node in a partition."""

    node: str
    partition: str
    state: str
    gres: str
    reason: str


#: The ``sinfo`` format :func:`parse_sinfo` reads; the reason goes last as it may hold ``|``.
SINFO_FORMAT = "%N|%P|%T|%G|%E"


def parse_sinfo(text: str) -> list[SinfoRow]:
    """Parse ``sinfo --noheader --Node --format='%N|%P|%T|%G|%E'`` output."""
    rows: list[SinfoRow] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        parts = raw.strip().split("|", 4)
        if len(parts) != 5:
            raise InputError(f"not sinfo {SINFO_FORMAT!r} output: {raw[:120]!r}")
        node, partition, state, gres, reason = (p.strip() for p in parts)
        rows.append(
            SinfoRow(
                node=node,
                partition=partition.rstrip("*"),
                state=state,
                gres="" if gres == "(null)" else gres,
                reason="" if reason == "none" else reason,
            )
        )
    return rows


@dataclass(frozen=True)
class NodeChange:
    """The outcome of an operation for one node."""

    node: str
    action: str
    changed: bool
    before: str
    after: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def expand_nodes(expression: str | Iterable[str]) -> list[str]:
    """Expand hostlist expressions (``gpu[001-004],login01``); raise InputError when malformed."""
    exprs = [expression] if isinstance(expression, str) else list(expression)
    names: list[str] = []
    for expr in exprs:
        try:
            names += hostlist.expand_hostlist(expr)
        except hostlist.BadHostlist as exc:
            raise InputError(f"bad hostlist {expr!r}: {exc}") from exc
    if not names:
        raise InputError("no nodes given")
    return list(dict.fromkeys(names))


def collect_nodes(names: Iterable[str]) -> str:
    """Compress node names into one hostlist expression."""
    return str(hostlist.collect_hostlist(list(names)))


def _check(result: CommandResult, argv: Sequence[str]) -> str:
    if result.rc != 0:
        detail = (result.stderr or result.stdout).strip()[-1000:]
        raise OperationError(f"{shlex.join(argv)} exited {result.rc}: {detail or '(no output)'}")
    return result.stdout


def node_states(
    runner: Runner, nodes: str | Iterable[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> list[NodeState]:
    """Return the state of ``nodes`` (a hostlist expression or names), or of every node.

    Raises InputError naming nodes that Slurm does not know.
    """
    argv = ["scontrol", "--oneliner", "show", "node"]
    wanted: list[str] = []
    if nodes is not None:
        wanted = expand_nodes(nodes)
        argv.append(collect_nodes(wanted))
    result = runner.run(argv, timeout=timeout)
    if result.rc != 0 and wanted and "not found" in (result.stderr + result.stdout):
        raise InputError(f"unknown node(s) in {collect_nodes(wanted)}: {result.stderr.strip()}")
    states = parse_scontrol_nodes(_check(result, argv))
    if wanted:
        missing = sorted(set(wanted) - {s.name for s in states})
        if missing:
            raise InputError(f"Slurm does not know node(s) {collect_nodes(missing)}")
    return states


def _require_reason(reason: str) -> str:
    text = " ".join(reason.split())
    if not text:
        raise InputError("a reason is required: say why the node's state changes")
    return text


def drain(
    runner: Runner, nodes: str | Iterable[str], reason: str, *, timeout: float = DEFAULT_TIMEOUT
) -> list[NodeChange]:
    """Drain ``nodes`` with ``reason``; nodes already drained with that reason stay untouched.

    A drained node whose reason differs gets the new reason (Slurm keeps one reason per node).
    """
    why = _require_reason(reason)
    before = {s.name: s for s in node_states(runner, nodes, timeout=timeout)}
    todo = [n for n, s in before.items() if not (s.drained and s.reason == why)]
    if todo:
        argv = [
            "scontrol",
            "update",
            f"NodeName={collect_nodes(todo)}",
            "State=DRAIN",
            f"Reason={why}",
        ]
        _check(runner.run(argv, timeout=timeout), argv)
    after = {s.name: s for s in node_states(runner, todo, timeout=timeout)} if todo else {}
    return [
        NodeChange(
            node=name,
            action="drain",
            changed=name in after,
            before=state.state_text,
            after=after[name].state_text if name in after else state.state_text,
            reason=why,
        )
        for name, state in before.items()
    ]


def resume(
    runner: Runner, nodes: str | Iterable[str], reason: str, *, timeout: float = DEFAULT_TIMEOUT
) -> list[NodeChange]:
    """Return drained or down ``nodes`` to service; ``reason`` is recorded in the result.

    Slurm clears a node's reason on resume, so the caller (the rollout's state store, or the
    CLI's output) keeps it.  Nodes already in service are reported unchanged.
    """
    why = _require_reason(reason)
    before = {s.name: s for s in node_states(runner, nodes, timeout=timeout)}
    todo = [n for n, s in before.items() if s.resumable]
    if todo:
        argv = ["scontrol", "update", f"NodeName={collect_nodes(todo)}", "State=RESUME"]
        _check(runner.run(argv, timeout=timeout), argv)
    after = {s.name: s for s in node_states(runner, todo, timeout=timeout)} if todo else {}
    return [
        NodeChange(
            node=name,
            action="resume",
            changed=name in after,
            before=state.state_text,
            after=after[name].state_text if name in after else state.state_text,
            reason=why,
        )
        for name, state in before.items()
    ]


def reserve(
    runner: Runner, name: str, nodes: str | Iterable[str], *, timeout: float = DEFAULT_TIMEOUT
) -> list[NodeChange]:
    """Close ``nodes`` to users in maintenance reservation ``name`` and return them to service.

    Acceptance jobs (multi-node NCCL through ``srun``) need the nodes up, but new nodes join
    drained and Slurm schedules nothing on a drained node, not even inside a reservation. A
    ``maint,ignore_jobs`` reservation for root keeps user jobs off while the nodes are resumed.
    Creates the reservation, or moves an existing one (a killed run's) onto ``nodes``.
    """
    names = collect_nodes(expand_nodes(nodes))
    exists = runner.run(["scontrol", "show", f"ReservationName={name}"], timeout=timeout).rc == 0
    argv = [
        "scontrol",
        "update" if exists else "create",
        f"ReservationName={name}",
        f"Nodes={names}",
    ]
    if not exists:
        argv += ["StartTime=now", "Duration=infinite", "Users=root", "Flags=maint,ignore_jobs"]
    _check(runner.run(argv, timeout=timeout), argv)
    return resume(runner, names, f"gpuforge: validating inside reservation {name}", timeout=timeout)


@contextmanager
def maintenance_window(
    runner: Runner, name: str, nodes: str | Iterable[str], *, timeout: float = DEFAULT_TIMEOUT
) -> Iterator[None]:
    """Open ``nodes`` to root's jobs only, in reservation ``name``; afterwards, put them back.

    For acceptance jobs on nodes that may be drained (quarantined earlier, repaired since): the
    nodes are resumed inside a maintenance reservation (:func:`reserve`), and on the way out,
    whatever happened in between, each node drained before is drained again with its own
    reason, and the reservation is deleted. Deciding new states is the caller's job, after.
    """
    names = expand_nodes(nodes)
    before = node_states(runner, names, timeout=timeout)
    try:
        reserve(runner, name, names, timeout=timeout)
        yield
    finally:
        by_reason: dict[str, list[str]] = {}
        for state in before:
            if state.drained:
                reason = state.reason or "drained before validation"
                by_reason.setdefault(reason, []).append(state.name)
        for reason, hosts in sorted(by_reason.items()):
            drain(runner, hosts, reason, timeout=timeout)
        release(runner, name, timeout=timeout)


def release(runner: Runner, name: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Delete reservation ``name``; False when there was none."""
    if runner.run(["scontrol", "show", f"ReservationName={name}"], timeout=timeout).rc != 0:
        return False
    argv = ["scontrol", "delete", f"ReservationName={name}"]
    _check(runner.run(argv, timeout=timeout), argv)
    return True
