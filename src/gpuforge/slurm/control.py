"""Slurm control: read node and reservation state, drain, resume, reserve and release.

These are the raw operations. Automatic actions (deploy, ``validate --drain``, health) decide
through :mod:`gpuforge.admission`, which calls these; ``gpuforge slurm`` exposes them to
operators. Every function takes a :class:`SlurmClient`, so the same code runs ``scontrol``
locally on a controller or on a controller reached over SSH.

Parsing is pure: :func:`parse_scontrol_nodes` and :func:`parse_sinfo` turn the text Slurm prints
into typed values.  We parse ``scontrol -o show node`` rather than ``--json`` because the text form
is identical from Slurm 20.11 to 24.x while the JSON schema changes with every data_parser version.

Operations are idempotent: draining a node already drained with the same reason, or resuming a
node that is not drained or down, issues no ``scontrol update`` and reports the node unchanged.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import hostlist

from gpuforge.command import CommandResult, CommandRunner, LocalRunner, SshRunner
from gpuforge.errors import InputError, OperationError
from gpuforge.ssh import SshTarget

#: Seconds any single Slurm command may take before we give up on it.
DEFAULT_TIMEOUT = 60.0
#: Exit status of a shell that could not find the command.
COMMAND_NOT_FOUND_RC = 127

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
#: Base states or flags of a node that runs (or is still cleaning up after) a job: a drained node
#: in one of them is draining, not drained (``MIXED+DRAIN``, ``IDLE+COMPLETING+DRAIN``).
BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


@dataclass(frozen=True)
class SlurmClient:
    """Where Slurm's client commands (``scontrol``, ``sinfo``) run: a host and its runner.

    ``runner`` is any :class:`~gpuforge.command.CommandRunner`: :class:`~gpuforge.command.SshRunner`
    for a controller reached over SSH, :class:`~gpuforge.command.LocalRunner` on the controller
    itself, a fake in tests. Unlike the validators, Slurm operations cannot go on without an
    answer, so a timeout, an unreachable host or a missing binary raises OperationError.
    """

    runner: CommandRunner
    host: str = "localhost"

    @classmethod
    def local(cls) -> SlurmClient:
        """Run Slurm commands on this machine (a controller or a login node)."""
        return cls(LocalRunner(), "localhost")

    @classmethod
    def over_ssh(cls, host: str, hostvars: Mapping[str, Any] | None = None) -> SlurmClient:
        """Run Slurm commands on ``host`` over SSH, with its Ansible connection variables."""
        target = SshTarget.from_hostvars(host, hostvars or {})
        return cls(SshRunner({host: target}), host)

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """Run ``argv``; return its result whatever the exit status (raise when nothing ran)."""
        line = shlex.join(argv)
        result = self.runner.run(self.host, line, timeout=timeout)
        if result.timed_out:
            raise OperationError(f"timed out after {timeout:.0f}s on {self.host}: {line}")
        if result.unreachable:
            raise OperationError(
                f"ssh to {self.host} failed: {result.stderr.strip()[-500:] or '(no output)'}"
            )
        if result.rc == COMMAND_NOT_FOUND_RC or result.rc is None:
            raise OperationError(f"{argv[0]}: command not found on {self.host}")
        return result


@dataclass(frozen=True)
class SlurmNode:
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
    def busy(self) -> bool:
        """True while a job runs on the node or is completing there (CPUs allocated)."""
        return bool(BUSY.intersection((self.state, *self.flags))) or self.cpus_alloc > 0

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


def _node_from_fields(fields: Mapping[str, str]) -> SlurmNode:
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
    return SlurmNode(
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


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """Parse ``scontrol [-o] show node`` output (one-line or multi-line form) into nodes.

    Records start at a line beginning with ``NodeName=``; the multi-line form continues on
    indented lines.  Raises InputError on text that holds no node record but is not empty.
    """
    records = _records(text, "NodeName=", "No nodes in the system", "node")
    return [_node_from_fields(fields) for fields in records]


def _records(text: str, first_key: str, none: str, kind: str) -> list[dict[str, str]]:
    """The ``Key=value`` records of ``scontrol show`` output, one-line or multi-line form.

    A record starts at a line beginning with ``first_key`` and continues on the lines after it;
    ``none`` is what scontrol prints when there are no records.
    """
    records: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(first_key):
            records.append(_split_fields(line))
        elif records:
            records[-1].update(_split_fields(line))
        elif line.startswith(none):
            return []
        else:
            raise InputError(f"not scontrol {kind} output: {line[:120]!r}")
    return records


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
class NodeAction:
    """What was done (or deliberately not done) to one node in Slurm, and why.

    The one record of a Slurm action in gpuforge: :func:`drain` and :func:`resume` return it, and
    so does every decision of :mod:`gpuforge.admission` (which adds actions such as ``hold`` and
    ``refused``). Reports and the CLI print it.
    """

    node: str
    action: str
    changed: bool
    reason: str = ""
    detail: str = ""
    before: str = ""
    after: str = ""
    shadow: bool = False  # decided and recorded, but not done (admission's shadow mode)

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
    slurm: SlurmClient,
    nodes: str | Iterable[str] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[SlurmNode]:
    """Return the state of ``nodes`` (a hostlist expression or names), or of every node.

    Raises InputError naming nodes that Slurm does not know.
    """
    argv = ["scontrol", "--oneliner", "show", "node"]
    wanted: list[str] = []
    if nodes is not None:
        wanted = expand_nodes(nodes)
        argv.append(collect_nodes(wanted))
    result = slurm.run(argv, timeout=timeout)
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
    slurm: SlurmClient,
    nodes: str | Iterable[str],
    reason: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[NodeAction]:
    """Drain ``nodes`` with ``reason``; nodes already drained with that reason stay untouched.

    A drained node whose reason differs gets the new reason (Slurm keeps one reason per node).
    This is the raw operation: automatic drains go through :mod:`gpuforge.admission`, which
    decides whether a node may be drained at all.
    """
    why = _require_reason(reason)
    return _update(
        slurm,
        nodes,
        "drain",
        why,
        needs=lambda s: not (s.drained and s.reason == why),
        settings=["State=DRAIN", f"Reason={why}"],
        timeout=timeout,
    )


def resume(
    slurm: SlurmClient,
    nodes: str | Iterable[str],
    reason: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[NodeAction]:
    """Return drained or down ``nodes`` to service; ``reason`` is recorded in the result.

    Slurm clears a node's reason on resume, so the caller (the rollout's state store, or the
    CLI's output) keeps it.  Nodes already in service are reported unchanged. This is the raw
    operation: it resumes whoever drained the node, so automatic resumes go through
    :mod:`gpuforge.admission`, which never resumes an operator's drain.
    """
    return _update(
        slurm,
        nodes,
        "resume",
        _require_reason(reason),
        needs=lambda s: s.resumable,
        settings=["State=RESUME"],
        timeout=timeout,
    )


def _update(
    slurm: SlurmClient,
    nodes: str | Iterable[str],
    action: str,
    why: str,
    *,
    needs: Callable[[SlurmNode], bool],
    settings: list[str],
    timeout: float,
) -> list[NodeAction]:
    """``scontrol update`` of the nodes that ``needs`` it, one call; every node's before/after."""
    before = {s.name: s for s in node_states(slurm, nodes, timeout=timeout)}
    todo = [n for n, s in before.items() if needs(s)]
    if todo:
        argv = ["scontrol", "update", f"NodeName={collect_nodes(todo)}", *settings]
        _check(slurm.run(argv, timeout=timeout), argv)
    after = {s.name: s for s in node_states(slurm, todo, timeout=timeout)} if todo else {}
    return [
        NodeAction(
            node=name,
            action=action,
            changed=name in after,
            reason=why,
            before=state.state_text,
            after=after[name].state_text if name in after else state.state_text,
        )
        for name, state in before.items()
    ]


#: Flags a node shows for a while after a resume, until slurmd answers slurmctld's next ping
#: (``IDLE+NOT_RESPONDING`` for a node that was DOWN "Not responding"), or while it powers up.
SETTLING_FLAGS = frozenset({"NOT_RESPONDING", "POWERING_UP"})


def settle(
    slurm: SlurmClient,
    nodes: str | Iterable[str],
    *,
    within: float,
    poll: float = 2.0,
    timeout: float = DEFAULT_TIMEOUT,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, SlurmNode], bool]:
    """The states ``nodes`` settle in: polled until none shows a :data:`SETTLING_FLAGS` flag.

    Returns the last states read and whether they settled within ``within`` seconds; a node
    still settling then is reported as it is (the caller says that it has not settled).
    """
    deadline = clock() + within
    while True:
        states = {s.name: s for s in node_states(slurm, nodes, timeout=timeout)}
        settling = [s for s in states.values() if SETTLING_FLAGS.intersection(s.flags)]
        if not settling:
            return states, True
        if clock() + poll > deadline:
            return states, False
        sleep(poll)


@dataclass(frozen=True)
class Reservation:
    """One reservation as ``scontrol show reservation`` reports it."""

    name: str
    nodes: str
    flags: tuple[str, ...] = ()
    users: str = ""
    state: str = ""


def parse_reservations(text: str) -> list[Reservation]:
    """Parse ``scontrol --oneliner show reservation`` output (also the multi-line form)."""
    records = _records(text, "ReservationName=", "No reservations in the system", "reservation")
    return [
        Reservation(
            name=f["ReservationName"],
            nodes="" if f.get("Nodes", "(null)") == "(null)" else f.get("Nodes", ""),
            flags=tuple(x for x in f.get("Flags", "").split(",") if x and x != "(null)"),
            users="" if f.get("Users", "(null)") == "(null)" else f.get("Users", ""),
            state=f.get("State", ""),
        )
        for f in records
    ]


def reservation(
    slurm: SlurmClient, name: str, *, timeout: float = DEFAULT_TIMEOUT
) -> Reservation | None:
    """Reservation ``name``, or None when Slurm has none by that name."""
    argv = ["scontrol", "--oneliner", "show", "reservation", name]
    result = slurm.run(argv, timeout=timeout)
    if result.rc != 0 and "not found" in (result.stderr + result.stdout).lower():
        return None
    found = [r for r in parse_reservations(_check(result, argv)) if r.name == name]
    return found[0] if found else None


def reserve(
    slurm: SlurmClient, name: str, nodes: str | Iterable[str], *, timeout: float = DEFAULT_TIMEOUT
) -> Reservation:
    """Put ``nodes`` in maintenance reservation ``name`` (root only, ``maint,ignore_jobs``).

    Acceptance jobs (multi-node NCCL through ``srun``) need the nodes up, but new nodes join
    drained and Slurm schedules nothing on a drained node, not even inside a reservation. A
    ``maint,ignore_jobs`` reservation for root keeps user jobs off while the nodes are resumed.
    Creates the reservation, or moves an existing one (a killed run's) onto ``nodes``. Resuming
    the nodes is the caller's decision (:mod:`gpuforge.admission` records what it resumes).
    """
    names = collect_nodes(expand_nodes(nodes))
    exists = reservation(slurm, name, timeout=timeout) is not None
    argv = [
        "scontrol",
        "update" if exists else "create",
        f"ReservationName={name}",
        f"Nodes={names}",
    ]
    if not exists:
        argv += ["StartTime=now", "Duration=infinite", "Users=root", "Flags=maint,ignore_jobs"]
    _check(slurm.run(argv, timeout=timeout), argv)
    return Reservation(name, names, ("MAINT", "IGNORE_JOBS"), "root")


def release(slurm: SlurmClient, name: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Delete reservation ``name``; False when there was none."""
    if reservation(slurm, name, timeout=timeout) is None:
        return False
    argv = ["scontrol", "delete", f"ReservationName={name}"]
    _check(slurm.run(argv, timeout=timeout), argv)
    return True
