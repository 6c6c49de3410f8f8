"""The one path into Slurm: maintenance windows, admission of verdicts, the circuit breaker.

Every automatic Slurm action of gpuforge (``deploy``, ``validate --drain``, and the health,
conformance and upgrade work that builds on them) goes through :class:`Admission`;
:mod:`gpuforge.slurm.control` holds the raw operations it uses. The rules (docs/slurm.md,
"Admission"):

* a node that failed (``quarantine``) is drained with a reason in the one format
  ``gpuforge:<check>:<action>`` (:func:`format_reason`, at most :data:`REASON_MAX` characters);
  the action is the caller's, else the strongest one its failed checks name (the Xid
  catalogue's ``reset_gpu``, ``reboot``, ...: :attr:`NodeVerdict.action`), else ``quarantine``;
* a node whose validation was inconclusive (``hold``: a check could not run) is left exactly as it
  was: never drained on that evidence, never resumed;
* a node that passed is resumed only if gpuforge drained it (its reason parses with
  :func:`parse_reason`); a drain in any other words is an operator's and is never touched, and a
  failed node already drained by an operator keeps the operator's reason;
* every decision is idempotent and returns a :class:`~gpuforge.slurm.control.NodeAction`, which
  is also written to the admission record (SQLite, ``<state>/<cluster>/admission.db``);
* a drain that takes a node out of service passes the :class:`CircuitBreaker` first, when one is
  configured; what it refuses is recorded, not done;
* in shadow mode decisions are recorded and returned, and nothing changes in Slurm.

A maintenance window (:meth:`Admission.open_window`) is a root-only ``maint,ignore_jobs``
reservation in which the nodes are resumed for acceptance jobs. Its record (reservation name,
nodes, and how each node was before) is written before Slurm is touched, so a killed run leaves
a window that the next run, or ``gpuforge slurm window close``, closes: every node not decided by
:meth:`Admission.admit` gets its earlier state back, then the reservation is deleted. Every
caller that validates nodes in a window (deploy and upgrade, ``validate --drain``, remediation,
conformance) goes through the one :class:`ValidationWindow`: open → validate → admit → close,
the window closed on every way out.

An operator's ``gpuforge slurm drain|resume`` goes through :meth:`Admission.operator_drain` and
:meth:`Admission.operator_resume`: done as told (an explicit command is never refused by the
circuit breaker, and its drains do not use up the automatic budget: ``operator`` is
:data:`PLANNED`), and recorded with source ``operator``. An operator's drain in its own words is
never lifted by gpuforge's automatic actions (:func:`is_ours`); one written in gpuforge's format
(``gpuforge:gpu.xid:reboot``) hands the node to gpuforge on purpose (``gpuforge remediate``).
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gpuforge import database
from gpuforge.database import Foreign, Schema, Step
from gpuforge.errors import InputError, OperationError
from gpuforge.slurm import control
from gpuforge.slurm.control import DEFAULT_TIMEOUT, NodeAction, SlurmClient, SlurmNode
from gpuforge.state_paths import StatePaths
from gpuforge.validate.result import NodeVerdict, Status, Verdict

#: Every reason gpuforge writes starts with this and a colon.
REASON_PREFIX = "gpuforge"
#: Longest reason gpuforge writes. Slurm's accounting keeps a node event's reason in a MySQL
#: ``tinytext`` column (255 bytes) and ``sinfo -R`` prints reasons in a fixed-width column; 64
#: ASCII characters stay whole in both and leave room for a long check name.
REASON_MAX = 64
#: The drain actions a reason may name (the ``<action>`` part). ``quarantine``: validation found
#: the node bad, repair and re-validate; ``validate``: not validated yet (new nodes join drained);
#: the others are remediation catalogue actions (docs/slurm.md).
ACTIONS = ("quarantine", "validate", "reset_gpu", "reboot", "inspect", "rma")
#: What the slurm role writes on a node whose slurmd starts for the first time.
JOIN_REASON = f"{REASON_PREFIX}:join:validate"

_CHECK_SAFE = re.compile(r"[^A-Za-z0-9._\[\]\-]")
_REASON = re.compile(
    rf"^{REASON_PREFIX}:(?P<check>[A-Za-z0-9._\[\]\-]+?)(?P<cut>~)?(?:\+(?P<more>[0-9]+))?"
    r":(?P<action>[a-z_]+)$"
)


@dataclass(frozen=True)
class Reason:
    """A parsed gpuforge reason: the (first) failed check, the action, how many more checks."""

    check: str
    action: str
    more: int = 0
    truncated: bool = False

    def __str__(self) -> str:
        return format_reason(self.check, self.action, more=self.more)


def format_reason(check: str, action: str, *, more: int = 0) -> str:
    """``gpuforge:<check>[+<more>]:<action>``, at most :data:`REASON_MAX` characters.

    ``check`` is the first failed check; characters other than letters, digits and ``._[]-``
    become ``_`` (Slurm shows the reason as typed; ``:`` separates the fields). ``more`` counts
    the node's other failed checks. When the whole does not fit, the check name is cut from the
    right and ``~`` marks the cut; the prefix, the count and the action are never cut.
    """
    if action not in ACTIONS:
        raise InputError(f"unknown drain action {action!r} (one of {', '.join(ACTIONS)})")
    name = _CHECK_SAFE.sub("_", check.strip()) or "unknown"
    tail = (f"+{more}" if more > 0 else "") + f":{action}"
    head = f"{REASON_PREFIX}:"
    room = REASON_MAX - len(head) - len(tail)
    if len(name) > room:
        name = name[: room - 1] + "~"
    return head + name + tail


def parse_reason(text: str) -> Reason | None:
    """The :class:`Reason` in ``text`` when gpuforge wrote it, else None (an operator's words)."""
    match = _REASON.match(text.strip())
    if match is None or match.group("action") not in ACTIONS:
        return None
    return Reason(
        check=match.group("check"),
        action=match.group("action"),
        more=int(match.group("more") or 0),
        truncated=bool(match.group("cut")),
    )


def is_ours(reason: str) -> bool:
    """True when gpuforge wrote ``reason``: only such drains does gpuforge ever lift."""
    return parse_reason(reason) is not None


def verdict_reason(verdict: NodeVerdict, action: str = "quarantine") -> str:
    """The drain reason for a failed node: its first failed check, and how many more.

    When a failed check calls for ``action`` itself (the Xid catalogue's ``reboot`` for
    ``gpu.xid``), that check is named first, so the reason says why the node needs it.
    """
    checks = list(verdict.reasons) or ["unknown"]
    carrier = next(
        (r.check for r in verdict.results if r.status is Status.FAIL and r.action == action), None
    )
    if carrier in checks:
        checks.remove(carrier)
        checks.insert(0, carrier)
    return format_reason(checks[0], action, more=len(checks) - 1)


# -- the circuit breaker -------------------------------------------------------------------------


#: The ``source`` an operator's ``gpuforge slurm drain|resume`` is recorded under.
OPERATOR = "operator"

#: Sources whose drains are planned work with limits of their own (a rolling upgrade's waves, an
#: operator's hand): they do not use up the circuit breaker, which caps what automatic fault
#: verdicts (health, conformance, validate, predictions) take out of service.
PLANNED = frozenset({"upgrade", OPERATOR})


@dataclass(frozen=True)
class BreakerPolicy:
    """How many nodes gpuforge may take out of service within ``window_s`` seconds.

    ``max_fraction`` of ``population`` nodes (the fleet or a partition, at least one node) and
    ``max_per_group`` nodes of any one group (``groups`` maps a node to its leaf switch, or any
    other failure domain; a node without a group counts only towards the total). Only drains
    that take a node out of service count: re-draining a node that was already out (a new node,
    a node already quarantined) is never refused, and drains by a :data:`PLANNED` source (an
    upgrade's wave) are not counted.
    """

    population: int
    max_fraction: float = 0.01
    max_per_group: int | None = None
    groups: Mapping[str, str] = field(default_factory=dict)
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.population < 1:
            raise InputError(f"breaker population must be at least 1, not {self.population}")
        if not 0 < self.max_fraction <= 1:
            raise InputError(f"breaker max_fraction must be in (0, 1], not {self.max_fraction}")
        if self.max_per_group is not None and self.max_per_group < 1:
            raise InputError(f"breaker max_per_group must be at least 1, not {self.max_per_group}")
        if self.window_s <= 0:
            raise InputError(f"breaker window_s must be positive, not {self.window_s}")

    @property
    def max_total(self) -> int:
        """Most nodes taken out of service per window (at least one)."""
        return max(1, math.floor(self.max_fraction * self.population))


@dataclass
class CircuitBreaker:
    """Admits or refuses drains against a :class:`BreakerPolicy` and the recent drains."""

    policy: BreakerPolicy
    recent: list[str]  # nodes taken out of service within the window, oldest first

    def allow(self, node: str) -> str:
        """Empty when ``node`` may be drained now (and count it); else why not."""
        if len(self.recent) >= self.policy.max_total:
            return (
                f"circuit breaker: {len(self.recent)} node(s) taken out of service in the last "
                f"{self.policy.window_s:.0f}s, limit {self.policy.max_total} "
                f"({self.policy.max_fraction:.1%} of {self.policy.population})"
            )
        group = self.policy.groups.get(node)
        if group is not None and self.policy.max_per_group is not None:
            in_group = sum(1 for n in self.recent if self.policy.groups.get(n) == group)
            if in_group >= self.policy.max_per_group:
                return (
                    f"circuit breaker: {in_group} node(s) of {group} taken out of service in the "
                    f"last {self.policy.window_s:.0f}s, limit {self.policy.max_per_group}"
                )
        self.recent.append(node)
        return ""


# -- the admission record ------------------------------------------------------------------------

_V1 = """
CREATE TABLE IF NOT EXISTS windows (
    name TEXT PRIMARY KEY,
    nodes TEXT NOT NULL,       -- JSON list
    before TEXT NOT NULL,      -- JSON {node: drain reason, or null when it was in service}
    decided TEXT NOT NULL,     -- JSON list of nodes admit() has put in their final state
    opened_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    source TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    changed INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    shadow INTEGER NOT NULL,
    out_of_service INTEGER NOT NULL  -- 1: this drain took an in-service node out
);
CREATE INDEX IF NOT EXISTS actions_at ON actions (at);
"""


def _legacy(conn: sqlite3.Connection) -> int:
    """The version of a record written before application ids: 1 when it has our tables."""
    names = database.tables(conn)
    if not names:
        return 0
    if not names & {"windows", "actions"}:
        raise Foreign("no admission tables: another program's file")
    return 1


#: The admission record (``admission.db``): application id ``GFAD``; one owner, this module.
SCHEMA = Schema(
    kind="admission record",
    application_id=0x47464144,
    steps=(Step("gpuforge.admission", _V1),),
    legacy=_legacy,
    recovery="move it aside (keep it for the record) and run again: the maintenance windows "
    "it held are forgotten, so check `gpuforge slurm state` for nodes left drained with a "
    "gpuforge: reason",
)


@dataclass(frozen=True)
class WindowRecord:
    """An open maintenance window as recorded before Slurm was touched."""

    name: str
    nodes: tuple[str, ...]
    before: Mapping[str, str | None]  # node -> its drain reason before the window, or None
    decided: frozenset[str]
    opened_at: float


@dataclass(frozen=True)
class ActionRow:
    """One recorded admission action."""

    at: float
    source: str
    action: NodeAction
    out_of_service: bool


class AdmissionRecord:
    """The SQLite file that makes windows survive a killed run and feeds the breaker."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        """Open (creating or migrating unless ``readonly``) the record at ``path``.

        A file that is truncated, corrupt, not a database, another program's or of a newer
        schema raises :class:`InputError` and is never modified.
        """
        self.path = Path(path)
        self.readonly = readonly
        database.open_database(self.path, SCHEMA, readonly=readonly).close()

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """One transaction on a connection of its own (a record is shared by processes)."""
        db = database.attach(self.path, SCHEMA, readonly=self.readonly)
        if not self.readonly:
            db.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses no committed record
        try:
            with db.read() if self.readonly else db.transaction() as conn:
                yield conn
        finally:
            db.close()

    def window(self, name: str) -> WindowRecord | None:
        """The open window ``name``, or None."""
        with self._db() as db:
            row = db.execute(
                "SELECT name, nodes, before, decided, opened_at FROM windows WHERE name = ?",
                (name,),
            ).fetchone()
        return None if row is None else _window(row)

    def windows(self) -> list[WindowRecord]:
        """Every open window, oldest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT name, nodes, before, decided, opened_at FROM windows ORDER BY opened_at"
            ).fetchall()
        return [_window(r) for r in rows]

    def put_window(self, record: WindowRecord) -> None:
        """Write (or replace) ``record``."""
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?)",
                (
                    record.name,
                    json.dumps(list(record.nodes)),
                    json.dumps(dict(record.before), sort_keys=True),
                    json.dumps(sorted(record.decided)),
                    record.opened_at,
                ),
            )

    def drop_window(self, name: str) -> None:
        """Forget window ``name`` (after it was closed in Slurm)."""
        with self._db() as db:
            db.execute("DELETE FROM windows WHERE name = ?", (name,))

    def add_actions(self, at: float, source: str, rows: Iterable[tuple[NodeAction, bool]]) -> None:
        """Append actions, each with whether it took a node out of service."""
        with self._db() as db:
            db.executemany(
                "INSERT INTO actions (at, source, node, action, changed, reason, detail, shadow,"
                " out_of_service) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        at,
                        source,
                        a.node,
                        a.action,
                        int(a.changed),
                        a.reason,
                        a.detail,
                        int(a.shadow),
                        int(out),
                    )
                    for a, out in rows
                ],
            )

    def actions(self, *, since: float = 0.0, action: str | None = None) -> list[ActionRow]:
        """Recorded actions at or after ``since`` (optionally only one kind), oldest first."""
        query = (
            "SELECT at, source, node, action, changed, reason, detail, shadow, out_of_service"
            " FROM actions WHERE at >= ?"
        )
        args: list[object] = [since]
        if action is not None:
            query += " AND action = ?"
            args.append(action)
        with self._db() as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [
            ActionRow(
                at=r[0],
                source=r[1],
                action=NodeAction(
                    node=r[2],
                    action=r[3],
                    changed=bool(r[4]),
                    reason=r[5],
                    detail=r[6],
                    shadow=bool(r[7]),
                ),
                out_of_service=bool(r[8]),
            )
            for r in rows
        ]


def _window(row: tuple[str, str, str, str, float]) -> WindowRecord:
    return WindowRecord(
        name=row[0],
        nodes=tuple(json.loads(row[1])),
        before=json.loads(row[2]),
        decided=frozenset(json.loads(row[3])),
        opened_at=row[4],
    )


def record_path(state_dir: Path, cluster: str) -> Path:
    """Where the admission record of ``cluster`` lives under a state directory."""
    return StatePaths(state_dir, cluster).admission_db


# -- admission ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prior:
    """How a node stood before gpuforge acted: drained (with whose reason) or in service."""

    drained: bool
    reason: str

    @property
    def operator(self) -> bool:
        return self.drained and not is_ours(self.reason)


@dataclass
class Admission:
    """Every automatic Slurm action: windows, admit, breaker, shadow mode, all recorded.

    ``source`` names the caller in the record (``deploy``, ``validate``, ``health``).
    """

    slurm: SlurmClient
    record: AdmissionRecord
    source: str = "gpuforge"
    breaker: BreakerPolicy | None = None
    shadow: bool = False
    timeout: float = DEFAULT_TIMEOUT
    clock: Callable[[], float] = time.time

    # -- windows

    def open_window(self, name: str, nodes: Sequence[str]) -> WindowRecord:
        """Reserve ``nodes`` for root in maintenance reservation ``name`` and resume them there.

        The record is written first. A window of the same name left open by a killed run is
        taken over: nodes it already holds keep the state recorded for them then (they are
        resumed now only because of that window), new nodes are read from Slurm.
        """
        names = control.expand_nodes(list(nodes))
        old = self.record.window(name)
        before: dict[str, str | None] = dict(old.before) if old else {}
        fresh = [n for n in names if n not in before]
        if fresh:
            for state in control.node_states(self.slurm, fresh, timeout=self.timeout):
                before[state.name] = (state.reason or "(no reason)") if state.drained else None
        all_nodes = tuple(dict.fromkeys([*(old.nodes if old else ()), *names]))
        record = WindowRecord(
            name=name,
            nodes=all_nodes,
            before=before,
            decided=old.decided - set(names) if old else frozenset(),
            opened_at=old.opened_at if old else self.clock(),
        )
        self.record.put_window(record)
        control.reserve(self.slurm, name, all_nodes, timeout=self.timeout)
        drained = [n for n in names if before.get(n) is not None]
        if drained:
            control.resume(
                self.slurm,
                drained,
                f"inside maintenance reservation {name}",
                timeout=self.timeout,
            )
        return record

    def close_window(self, name: str) -> list[NodeAction]:
        """Give every node not decided by :meth:`admit` its earlier state; delete the reservation.

        Safe to call again, and for a window a killed run left: the record says what to do.
        """
        record = self.record.window(name)
        if record is None:
            control.release(self.slurm, name, timeout=self.timeout)
            return []
        was_drained = [
            n for n in record.nodes if n not in record.decided and record.before.get(n) is not None
        ]
        # A node drained again since the window opened keeps its newer reason.
        now = (
            control.node_states(self.slurm, was_drained, timeout=self.timeout)
            if was_drained
            else []
        )
        by_reason: dict[str, list[str]] = {}
        for state in now:
            reason = record.before[state.name]
            if reason is not None and not state.drained:
                by_reason.setdefault(reason, []).append(state.name)
        out: list[NodeAction] = []
        for reason, hosts in sorted(by_reason.items()):
            for change in control.drain(self.slurm, hosts, reason, timeout=self.timeout):
                out.append(
                    NodeAction(
                        node=change.node,
                        action="restore",
                        changed=change.changed,
                        reason=reason,
                        detail=f"drained again as before window {name}",
                        before=change.before,
                        after=change.after,
                    )
                )
        control.release(self.slurm, name, timeout=self.timeout)
        self.record.drop_window(name)
        self.record.add_actions(self.clock(), self.source, [(a, False) for a in out])
        return out

    def open_windows(self) -> list[WindowRecord]:
        """Windows recorded open (a killed run's, or one in progress)."""
        return self.record.windows()

    # -- an operator's hands

    def operator_drain(self, nodes: str | Sequence[str], reason: str) -> list[NodeAction]:
        """Drain ``nodes`` with the operator's ``reason`` as told, and record it (``operator``).

        Not passed through the circuit breaker (an explicit command is the operator's call) and
        not counted by it (``operator`` is :data:`PLANNED`); the record says which drains took a
        node out of service. A reason in other words than gpuforge's is never lifted by
        gpuforge's automatic actions.
        """
        changes = control.drain(self.slurm, nodes, reason, timeout=self.timeout)
        rows = [(c, c.changed and not _was_drained(c.before)) for c in changes]
        self.record.add_actions(self.clock(), OPERATOR, rows)
        return changes

    def operator_resume(self, nodes: str | Sequence[str], reason: str) -> list[NodeAction]:
        """Return ``nodes`` to service as told (whoever drained them), and record it."""
        changes = control.resume(self.slurm, nodes, reason, timeout=self.timeout)
        self.record.add_actions(self.clock(), OPERATOR, [(c, False) for c in changes])
        return changes

    # -- admission

    def admit(
        self,
        verdicts: Iterable[NodeVerdict],
        *,
        window: str | None = None,
        actions: Mapping[str, str] | None = None,
    ) -> list[NodeAction]:
        """Apply ``verdicts`` in Slurm by the module's rules; one :class:`NodeAction` per node.

        ``window``: the verdicts come from acceptance tests inside that open window; each
        node is judged against its state before the window and put in its final state now.
        ``actions`` names the drain action per failed node (default ``quarantine``).
        """
        todo = list(verdicts)
        if not todo:
            return []
        record = self.record.window(window) if window else None
        if window and record is None:
            raise OperationError(f"maintenance window {window} is not open")
        now_states = {
            s.name: s
            for s in control.node_states(self.slurm, [v.node for v in todo], timeout=self.timeout)
        }
        priors = {v.node: self._prior(v.node, now_states[v.node], record) for v in todo}
        breaker = self._breaker()
        plans = [self._plan(v, priors[v.node], (actions or {}).get(v.node), breaker) for v in todo]
        results = self._apply(plans, now_states)
        if record is not None and not self.shadow:
            decided = record.decided | {p.node for p in plans}
            self.record.put_window(
                WindowRecord(record.name, record.nodes, record.before, decided, record.opened_at)
            )
        self.record.add_actions(
            self.clock(), self.source, [(a, p.out_of_service) for a, p in results]
        )
        return [a for a, _ in results]

    def idle_in_service(self, nodes: Sequence[str], limit: int) -> list[str]:
        """Up to ``limit`` of ``nodes`` that are in service and idle now (partners for tests)."""
        if not nodes or limit < 1:
            return []
        states = control.node_states(self.slurm, list(nodes), timeout=self.timeout)
        idle = [s.name for s in states if s.state == "IDLE" and not s.flags and not s.reason]
        return idle[:limit]

    def refused(self, since: float = 0.0) -> list[NodeAction]:
        """Drains the circuit breaker refused at or after ``since``."""
        return [r.action for r in self.record.actions(since=since, action="refused")]

    def _prior(self, node: str, now: SlurmNode, record: WindowRecord | None) -> _Prior:
        if record is not None and node in record.before:
            reason = record.before[node]
            return _Prior(reason is not None, reason or "")
        return _Prior(now.drained, now.reason)

    def _breaker(self) -> CircuitBreaker | None:
        if self.breaker is None:
            return None
        since = self.clock() - self.breaker.window_s
        recent = [
            r.action.node
            for r in self.record.actions(since=since, action="drain")
            if r.out_of_service and r.action.shadow == self.shadow and r.source not in PLANNED
        ]
        return CircuitBreaker(self.breaker, recent)

    def _plan(
        self,
        verdict: NodeVerdict,
        prior: _Prior,
        action: str | None,
        breaker: CircuitBreaker | None,
    ) -> _Plan:
        node = verdict.node
        if verdict.verdict is Verdict.HOLD:
            why = ",".join(verdict.reasons) or "no results"
            return _Plan(node, "hold", prior, f"inconclusive ({why}): left as it was")
        if prior.operator:
            word = "passed" if verdict.verdict is Verdict.ADMIT else "failed"
            return _Plan(
                node, "none", prior, f"{word}, but drained by someone else: {prior.reason}"
            )
        if verdict.verdict is Verdict.ADMIT:
            detail = "passed" if prior.drained else "passed; in service"
            return _Plan(node, "resume" if prior.drained else "none", prior, detail)
        reason = verdict_reason(verdict, action or verdict.action or "quarantine")
        out_of_service = not prior.drained
        refusal = breaker.allow(node) if breaker is not None and out_of_service else ""
        if refusal:
            return _Plan(node, "refused", prior, refusal, reason=reason)
        return _Plan(
            node,
            "drain",
            prior,
            "failed " + ",".join(verdict.reasons),
            reason=reason,
            out_of_service=out_of_service,
        )

    def _apply(
        self, plans: list[_Plan], now: Mapping[str, SlurmNode]
    ) -> list[tuple[NodeAction, _Plan]]:
        """Bring Slurm to each plan's final state (nothing in shadow mode); return the records.

        A node is resumed only while its current drain is gpuforge's: one drained in other words
        since the window opened (an operator, Slurm's own health check) stays drained.
        """
        drains: dict[str, list[str]] = {}
        resumes: list[str] = []
        for i, p in enumerate(plans):
            target = p.target_reason
            current = now[p.node]
            if target is None and current.drained and not is_ours(current.reason):
                detail = f"{p.detail}, but drained since by someone else: {current.reason}"
                plans[i] = _Plan(p.node, "none", p.prior, detail)
            elif target is None and current.drained:
                resumes.append(p.node)
            elif target is not None and not (current.drained and current.reason == target):
                drains.setdefault(target, []).append(p.node)
        done: dict[str, NodeAction] = {}
        if not self.shadow:
            for reason, hosts in sorted(drains.items()):
                for c in control.drain(self.slurm, hosts, reason, timeout=self.timeout):
                    done[c.node] = c
            if resumes:
                for c in control.resume(
                    self.slurm, resumes, "gpuforge: admitted", timeout=self.timeout
                ):
                    done[c.node] = c
        out: list[tuple[NodeAction, _Plan]] = []
        for p in plans:
            state = now[p.node].state_text
            change = done.get(p.node)
            action = NodeAction(
                node=p.node,
                action=p.action,
                changed=p.changed and not self.shadow,
                reason=p.reason,
                detail=("shadow mode, not done: " if self.shadow else "") + p.detail,
                before=change.before if change else state,
                after=change.after if change else state,
                shadow=self.shadow,
            )
            out.append((action, p))
        return out


@dataclass(frozen=True)
class _Plan:
    """What admission decided for one node, and the Slurm state that decision ends in."""

    node: str
    action: str  # drain | resume | hold | none | refused
    prior: _Prior
    detail: str
    reason: str = ""
    out_of_service: bool = False

    @property
    def changed(self) -> bool:
        """Whether the decision changes the node against its state before gpuforge acted."""
        if self.action == "drain":
            return not (self.prior.drained and self.prior.reason == self.reason)
        return self.action == "resume" and self.prior.drained

    @property
    def target_reason(self) -> str | None:
        """The drain reason the node ends with, or None when it ends in service."""
        if self.action == "drain":
            return self.reason
        if self.action == "resume":
            return None
        # hold, none (operator's drain or already in service), refused: as it was before
        return self.prior.reason if self.prior.drained else None


def _was_drained(state_text: str) -> bool:
    return bool(control.DRAIN_FLAGS.intersection(state_text.split("+")))


@dataclass
class ValidationWindow:
    """open → validate → admit → close: the one way nodes are validated inside a window.

    ``name`` is the maintenance reservation (None: validation needs no window; :meth:`admit`
    then admits outside one, and :meth:`open`/:meth:`close` do nothing). :meth:`admit` closes the
    window whatever it does, and leaving the ``with`` block closes it on every other way out (a
    failed validation, Ctrl-C): each node not admitted gets its state from before the window.
    The record is written before Slurm is touched, so a killed run leaves a window the next run
    (or ``gpuforge slurm window close``) closes.

    Used as ``with ValidationWindow(adm, name, nodes) as window: ...; window.admit(verdicts)``,
    or in two halves (deploy's validate and admit steps): :meth:`open` ... :meth:`admit`.
    """

    admission: Admission
    name: str | None
    nodes: Sequence[str] = ()
    _open: bool = field(default=False, init=False)

    def open(self) -> ValidationWindow:
        """Reserve the nodes and resume them inside the window (:meth:`Admission.open_window`)."""
        if self.name is not None and self.nodes:
            self.admission.open_window(self.name, self.nodes)
            self._open = True
        return self

    def admit(
        self, verdicts: Iterable[NodeVerdict], *, actions: Mapping[str, str] | None = None
    ) -> list[NodeAction]:
        """Admit ``verdicts`` inside the window (:meth:`Admission.admit`), then close it."""
        try:
            if actions is None:
                return self.admission.admit(verdicts, window=self.name)
            return self.admission.admit(verdicts, window=self.name, actions=actions)
        finally:
            self.close(always=True)

    def close(self, *, always: bool = False) -> list[NodeAction]:
        """Give undecided nodes their earlier state; delete the reservation. Safe to repeat.

        ``always``: close the window by name even if this object did not open it (a window
        opened by deploy's validate step, admitted by its admit step).
        """
        if self.name is None or not (self._open or always):
            return []
        self._open = False
        return self.admission.close_window(self.name)

    def __enter__(self) -> ValidationWindow:
        return self.open()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()


def summarize(actions: Iterable[NodeAction]) -> dict[str, int]:
    """Number of nodes per action, for one-line reports."""
    return dict(Counter(a.action for a in actions))
