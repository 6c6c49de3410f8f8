"""The collector: nodes push their health records here; it stores them and decides on requests.

``gpuforge health serve`` runs one :class:`Collector` per cluster (a systemd service on the
controller; in the lab a background process on the lab network's gateway). HTTP by ``waitress``
(a WSGI server made for services: one event loop parses requests with size limits, worker threads
run them), every body made canonical by :mod:`gpuforge.health.intake` first:

* ``POST /v1/records``: one record (``gpuforge.record/1``, parsed by :mod:`gpuforge.node.record`)
  -> ``200 {"decision": {...}}`` (:class:`~gpuforge.health.decide.Decision`, and ``"refused"``
  naming the fields and events left out of the stored record); ``400`` a body or record the
  collector will never take (the error names the encoding or the field), ``403`` a record for a
  node sent from any address but that node's management address (no forged drains), ``411``/
  ``413``/``431`` no or too long a body, too long headers, ``422`` a record dated beyond
  ``max_future_s`` ahead (the node's clock is wrong), ``503`` the store could not take it now
  (the node keeps it in its spool and sends it again: the node retries 408, 429 and 5xx only);
* ``GET /v1/healthz``: ``{"status": "ok", ...}`` with queue depths and counts.

Every answer to ``POST /v1/records`` carries the collector's clock, ``"collector_time"`` (epoch
seconds): the node checker's ``node.clock`` check measures the node's clock against it.

Every refusal is one log line, a client gone mid-request or before its answer too; no log ever
holds a traceback (waitress's own log calls are folded into one line each).

Records go to a writer thread that stores each batch in one transaction (group commit: a request
is answered only after its record is committed, so an answered record is never lost). Requests
(``drain``/``resume``) go to one decider thread in batches too, so a fleet-wide burst meets the
circuit breaker batch by batch (:class:`~gpuforge.health.decide.Decider`). A record without a
request never touches Slurm. Every minute the controller's textfile metrics are rewritten
(:func:`~gpuforge.health.fleet.controller_metrics`: one ``scontrol show nodes``); every hour
the store is pruned.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Generic, TypeVar
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser, ParsingError
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask

from gpuforge.database import Damaged
from gpuforge.errors import GpuforgeError, InputError
from gpuforge.health import intake
from gpuforge.health.auth import Authenticator
from gpuforge.health.decide import Decider, Decision
from gpuforge.health.fleet import (
    Fleet,
    breaker_state,
    controller_metrics,
    fleet_status,
    write_textfile,
)
from gpuforge.history.store import HistoryStore, Retention, parse_time
from gpuforge.node.output import CLOCK_KEY, MUNGE_HEADER, SENT_HEADER
from gpuforge.node.record import from_dict
from gpuforge.rollout.lock import LockHeld, cluster_lock, holder
from gpuforge.slurm import control
from gpuforge.state_paths import collector_lock_of
from gpuforge.textfile import Family, render

log = logging.getLogger(__name__)

#: The collector's port (health.yaml's ``collector.url`` names it).
DEFAULT_PORT = 9477
#: Largest record body accepted: 20 checks with 2,000-character evidence and some counters.
MAX_BODY = 1 << 20
#: Largest request line and headers (a node sends about 200 bytes): 431 beyond.
MAX_HEADER = 16384
#: Worker threads answering requests (each waits for its record's group commit, and a drain
#: request for the decider): the batches are at most this large.
THREADS = 128
#: Open connections served at once; more wait in the listen backlog. Below the usual 1,024
#: descriptors of a service, with room for the store's.
CONNECTION_LIMIT = 900
#: A connection with no complete request for this long is closed (a slow client holds no thread).
IDLE_TIMEOUT_S = 10
#: Seconds a request waits for its record to be stored / its decision to be made. A node gives
#: up after its own timeout (2 s) and sends the record again with the next run; storing is
#: idempotent for the node's events, and admission's decisions are.
STORE_WAIT_S = 10.0
DECIDE_WAIT_S = 120.0
#: A request older than this (a spooled record sent late) is stored but not acted on: two of
#: slurmd's default 300 s health check intervals. The age is the record's own, measured on the
#: node's clock from its ``started`` to its sending (:func:`taken_at`), never the node's clock
#: against the collector's.
MAX_REQUEST_AGE_S = 600.0
#: A record dated further ahead of the collector's clock than this is refused (422): a node's
#: clock is wrong. NTP keeps nodes within milliseconds; 300 s is one health round.
MAX_FUTURE_S = 300.0
#: Errors of the writer that the record's content causes: the record will never be stored, so
#: the answer is a 4xx (the node drops it) rather than a 503 (the node would send it forever).
CONTENT_ERRORS = (
    InputError,
    ValueError,
    TypeError,
    KeyError,
    OverflowError,
    sqlite3.IntegrityError,
    sqlite3.DataError,
    sqlite3.InterfaceError,
)

T = TypeVar("T")
R = TypeVar("R")


class _Batcher(Generic[T, R]):
    """One thread applying ``work`` to everything queued so far: one call per batch."""

    def __init__(self, name: str, work: Callable[[list[T]], Sequence[R]], max_batch: int) -> None:
        self._work = work
        self._max = max_batch
        self._queue: queue.Queue[tuple[T, Future[R]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.batches = 0
        self.items = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)

    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, item: T) -> Future[R]:
        fut: Future[R] = Future()
        self._queue.put((item, fut))
        return fut

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self._max:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            try:
                results = self._work([item for item, _ in batch])
            except Exception as exc:
                # Each item that fails alone is reported by its caller (one line a request).
                log.debug("%s: batch of %d failed: %s", self._thread.name, len(batch),
                          _one_line(str(exc)))  # fmt: skip
                self._one_by_one(batch)
                continue
            self.batches += 1
            self.items += len(batch)
            for (_, fut), result in zip(batch, results, strict=True):
                fut.set_result(result)

    def _one_by_one(self, batch: list[tuple[T, Future[R]]]) -> None:
        # One bad item must not fail its neighbours: each is retried alone, and only the items
        # that fail alone get the exception.
        for item, fut in batch:
            try:
                (result,) = self._work([item])
            except Exception as exc:
                fut.set_exception(exc)
            else:
                self.batches += 1
                self.items += 1
                fut.set_result(result)


class HistoryHeld(GpuforgeError):  # noqa: N818 - reads as the outcome it reports
    """Another collector writes this history: one writer per history (exit 2, nothing done)."""

    exit_code = 2


def claim_history(history_db: Path, command: str) -> ExitStack:
    """Take the one-writer lock of the history ``history_db`` (``collector.lock`` beside it,
    :func:`~gpuforge.state_paths.collector_lock_of`): an ``flock`` the kernel drops when its
    holder dies, so a SIGKILLed collector leaves nothing to clean up. Close the stack to let go.

    Raises :class:`HistoryHeld` naming the holder (pid, host, since when) while another holds it.
    """
    lock = collector_lock_of(history_db)
    stack = ExitStack()
    try:
        stale = stack.enter_context(cluster_lock(lock, command))
    except LockHeld:
        who = holder(lock) or "a process that has just let go (try again)"
        raise HistoryHeld(
            f"{history_db} has a collector already: {who}; one writer per history (lock {lock})"
        ) from None
    except OSError as exc:
        raise InputError(f"{lock}: {exc.strerror or exc}") from None
    if stale:
        log.info("%s: %s", lock, stale)
    return stack


def node_time(value: str | None) -> float | None:
    """The node's clock from its ``X-Gpuforge-Sent`` header (epoch seconds), or None when it
    sent none, or one that is not a finite number."""
    if value is None or len(value) > 32:
        return None
    try:
        sent = float(value)
    except ValueError:
        return None
    return sent if math.isfinite(sent) else None


def taken_at(started: float, sent: float | None, received: float) -> float:
    """When a record was taken, on the collector's clock (what its request's age is measured
    from, and what the decider compares with its resumes).

    ``started`` and ``sent`` are both the node's clock (the record's start and its sending:
    munge's encode time, or the ``X-Gpuforge-Sent`` header), so their difference is the
    record's age however far the node's clock is off; the collector's ``received`` less that
    age is when it was taken. A spooled record sent an hour late is an hour old, a fresh record
    of a node 20 minutes behind is fresh. A record that names no send time (a node checker
    before the header, without a credential) is dated by its ``started`` alone: the node's clock.
    """
    if sent is None:
        return started
    return received - max(0.0, sent - started)


@dataclass(frozen=True)
class _Admitted:
    """A record the collector takes: what to store, and what it knows of its time and order."""

    record: dict[str, Any]
    started: float
    notes: list[str]  # what was left out of it
    seq: int | None  # the node's sequence number (None without a valid credential)
    sent: float | None  # the node's clock as it sent it (None: it named none)


class _Refusal(Exception):  # noqa: N818 - a refusal, not a program error
    """A record the collector will not take: the status, the error, the counter it adds to."""

    def __init__(self, status: int, error: str, kind: str = "forged") -> None:
        super().__init__(error)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    """What the collector answers one POST: an HTTP status and a JSON body."""

    status: int
    body: Mapping[str, Any]


class Collector:
    """Stores records, decides on requests, keeps the controller's metrics; thread-safe."""

    def __init__(
        self,
        fleet: Fleet,
        store: HistoryStore,
        decider: Decider,
        *,
        metrics_dir: Path | None = None,
        retention: Retention | None = None,
        max_batch: int = 1000,
        max_request_age_s: float = MAX_REQUEST_AGE_S,
        max_future_s: float = MAX_FUTURE_S,
        max_events_per_record: int = intake.EVENTS_PER_RECORD,
        max_events_per_node_hour: int = intake.EVENTS_PER_NODE_HOUR,
        clock: Callable[[], float] = time.time,
        auth: Authenticator | None = None,
    ) -> None:
        self.fleet = fleet
        self.auth = auth  # None: the source address alone (tests, conformance's own collector)
        self.max_request_age_s = max_request_age_s
        self.max_future_s = max_future_s
        self.events = intake.EventBudget(max_events_per_record, max_events_per_node_hour)
        self.store = store
        self.decider = decider
        self.metrics_dir = metrics_dir
        self.retention = retention or Retention()
        self.clock = clock
        self._writer: _Batcher[tuple[dict[str, Any], str, int | None], int] = _Batcher(
            "history-writer", self._store, max_batch
        )
        self._decider: _Batcher[tuple[dict[str, Any], float], Decision] = _Batcher(
            "decider", self._decide, max_batch
        )
        self._pruned = 0.0
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="metrics", daemon=True)
        self.refused = 0
        self._lock = threading.Lock()
        #: Records refused by kind (malformed, forged, future) and stored without some fields or
        #: events (trimmed); malformed HTTP requests (``http``) are counted by the server.
        #: ``fields``: the fields refused alone (set to null, left out, clipped) in stored records.
        self.counts = dict.fromkeys(
            ("malformed", "forged", "future", "trimmed", "fields", "http"), 0
        )
        #: Future-dated records refused, by node (a node whose clock is wrong).
        self.future_dated: dict[str, int] = {}
        self._node_at: dict[str, str] | None = None

    def start(self) -> None:
        """Start the writer, the decider and the minute ticker."""
        self._writer.start()
        self._decider.start()
        self._ticker.start()

    def stop(self) -> None:
        """Finish what is queued and stop the threads."""
        self._stop.set()
        self._writer.stop()
        self._decider.stop()
        if self._ticker.is_alive():
            self._ticker.join(timeout=30)

    def _store(self, items: list[tuple[dict[str, Any], str, int | None]]) -> list[int]:
        # In the order received: the store's order of a node's records is the collector's
        # (and the node's sequence), never the node's clock.
        records = [r for r, _, _ in items]
        self.store.ingest(
            records,
            received=self.clock(),
            texts=[t for _, t, _ in items],
            sequences=[q for _, _, q in items],
        )
        now = self.clock()
        if now - self._pruned >= 3600:
            self._pruned = now
            gone = self.store.prune(self.retention, now=now)
            if any(gone.values()):
                log.info("pruned history: %s", gone)
        return [1] * len(records)

    def _decide(self, items: list[tuple[dict[str, Any], float]]) -> list[Decision]:
        return self.decider.decide([r for r, _ in items], taken=[t for _, t in items])

    def receive(
        self, body: bytes, peer: str, credential: str | None = None, sent: str | None = None
    ) -> Answer:
        """Handle one posted record from address ``peer`` with its munge ``credential`` and the
        node's clock as it sent it (``sent``, the ``X-Gpuforge-Sent`` header).

        Every refusal is one log line and a 4xx the node does not retry (a record the
        collector will always refuse is dropped by the node); 503 only when the store could not
        take a record it would take later.
        """
        now = self.clock()
        try:
            taken = self._admit(body, peer, now, credential, sent)
        except _Refusal as exc:
            return self._refuse(peer, exc.status, str(exc), exc.kind)
        record, notes = taken.record, taken.notes
        node = record["node"]
        # The body passed every check unchanged: stored as sent (no second serialisation).
        text = intake.dumps(record) if notes else body.decode("utf-8")
        try:
            self._writer.submit((record, text, taken.seq)).result(timeout=STORE_WAIT_S)
        except Damaged as exc:  # the store's fault, not the record's: the node keeps it
            log.warning("%s: record from %s not stored (the node sends it again): %s",
                        peer, node, _one_line(str(exc)))  # fmt: skip
            return Answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not stored: {exc}"})
        except CONTENT_ERRORS as exc:
            # The record itself cannot be stored: the node drops it rather than resend it forever.
            return self._refuse(peer, HTTPStatus.BAD_REQUEST, f"not stored: {exc}", "malformed")
        except Exception as exc:
            log.warning("%s: record from %s not stored (the node sends it again): %s",
                        peer, node, _one_line(str(exc)))  # fmt: skip
            return Answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not stored: {exc}"})
        # The record's age on one clock (its start to its sending, both the node's), not the
        # node's clock against the collector's: a node behind is still drained, a replay of an
        # old spool is not acted on (docs/health.md, "Time and order are the collector's").
        at = taken_at(taken.started, taken.sent, now)
        age = self.clock() - at
        if not record.get("request"):
            decision = Decision(node, "none", "none", detail="no request")
        elif age > self.max_request_age_s:
            # A spooled record sent late (the collector was away): its request may be long out of
            # date (the node rebooted since, or an operator acted); the node's next run asks again
            # if it still holds.
            op = str(record["request"].get("op"))
            how = (
                "from its start to its sending, on the node's clock"
                if taken.sent is not None
                else "its start, on the node's clock, to its arrival: it named no send time"
            )
            decision = Decision(
                node, op, "none", detail=f"stale request: the record is {age:.0f}s old ({how})"
            )
        else:
            try:
                decision = self._decider.submit((record, at)).result(timeout=DECIDE_WAIT_S)
            except Exception as exc:
                op = str(record["request"].get("op"))
                decision = Decision(node, op, "error", detail=f"not decided: {exc}")
            self._note(decision)
        answer: dict[str, Any] = {"decision": decision.to_dict()}
        if notes:
            answer["refused"] = notes
        return Answer(HTTPStatus.OK, answer)

    def _admit(
        self, body: bytes, peer: str, now: float, credential: str | None, sent: str | None
    ) -> _Admitted:
        """The record to store, with its start time, what was left out of it, its node's
        sequence number and send time; or :class:`_Refusal`."""
        try:
            taken = intake.canonical(body)
            # A time the store cannot read is refused alone (named), not the whole record.
            fields = [*taken.refused, *intake.refuse_times(taken.record, now)]
            record = from_dict(taken.record, "record").to_dict()
        except intake.Refused as exc:
            raise _Refusal(exc.status, str(exc), "malformed") from None
        except InputError as exc:
            raise _Refusal(HTTPStatus.BAD_REQUEST, str(exc), "malformed") from None
        node = record["node"]
        expected = self.fleet.addresses.get(node)
        if expected is None:
            raise _Refusal(HTTPStatus.FORBIDDEN, f"{node} is not a GPU node of {self.fleet.name}")
        if peer.removeprefix("::ffff:") != expected:  # an IPv4 peer of a dual-stack socket
            raise _Refusal(
                HTTPStatus.FORBIDDEN,
                f"a record for {node} is accepted only from {node}'s management address"
                f" (its address is {expected})",
            )
        # The record's munge credential: after the source address, before its date.
        seq = None
        # When the node sent it, on its clock: munge's encode time when the credential vouches
        # for the record (a header could be changed in flight), else the node's header.
        sent_at = node_time(sent)
        if self.auth is not None:
            verdict = self.auth.check(node, expected, body, credential)
            if not verdict.ok:
                raise _Refusal(verdict.status, verdict.error)
            seq = verdict.sequence
            if verdict.authenticated and verdict.sent is not None:
                sent_at = verdict.sent
        try:
            started = parse_time(record["started"], "record.started")
        except InputError as exc:
            raise _Refusal(HTTPStatus.BAD_REQUEST, str(exc), "malformed") from None
        if started - now > self.max_future_s:
            # A node whose clock runs ahead: stored, its record would stay the node's latest
            # until the clock caught up, and hide every real record after it.
            with self._lock:
                self.future_dated[node] = self.future_dated.get(node, 0) + 1
            raise _Refusal(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                f"record.started: {record['started']} is {started - now:.0f} s ahead of the"
                f" collector's clock (at most {self.max_future_s:.0f} s): {node}'s clock is wrong",
                "future",
            )
        notes = list(fields)
        if fields:
            with self._lock:
                self.counts["fields"] += len(fields)
        events = record.get("events") or []
        kept = self.events.take(node, len(events), now)
        if kept < len(events):
            record["events"] = events[:kept]
            notes.append(
                f"events: {len(events) - kept} of {len(events)} not stored (the cap is "
                f"{self.events.per_record} a record, {self.events.per_node_hour} a node an hour)"
            )
        if notes:
            with self._lock:
                self.counts["trimmed"] += 1
            log.warning("%s: record from %s stored without: %s", peer, node,
                        _one_line("; ".join(notes)))  # fmt: skip
        return _Admitted(record, started, notes, seq, sent_at)

    def _refuse(self, peer: str, status: int, error: str, kind: str) -> Answer:
        """One log line, one count, and the answer for a record the collector will not take."""
        with self._lock:
            self.counts[kind] += 1
        log.warning("%s: refused a record (%d): %s", peer, status, _one_line(error))
        return Answer(status, {"error": error})

    def _note(self, decision: Decision) -> None:
        if decision.done in ("drained", "resumed", "refused", "held", "shadow", "error"):
            log.info(
                "%s: %s %s (%s) %s",
                decision.node,
                decision.request,
                decision.done,
                decision.reason,
                decision.detail,
            )
        if decision.done == "refused":
            self.refused += 1
            try:  # the alert should not wait for the minute's rewrite
                self.write_metrics(read_slurm=False)
            except (OSError, GpuforgeError) as exc:
                log.warning("controller metrics not written: %s", exc)

    def node_at(self, peer: str) -> str | None:
        """The GPU node whose management address ``peer`` is, or None."""
        if self._node_at is None:
            self._node_at = {a: n for n, a in reversed(list(self.fleet.addresses.items()))}
        return self._node_at.get(peer.removeprefix("::ffff:"))

    def healthz(self) -> dict[str, Any]:
        """The ``GET /v1/healthz`` body."""
        return {
            "status": "ok",
            "cluster": self.fleet.name,
            "nodes": len(self.fleet.nodes),
            "store_queue": self._writer.depth(),
            "decide_queue": self._decider.depth(),
            "stored": self._writer.items,
            "batches": self._writer.batches,
            "refused": self.refused,
            "records_refused": {
                k: v for k, v in self.counts.items() if k not in ("trimmed", "fields", "http")
            },
            "records_trimmed": self.counts["trimmed"],
            "fields_refused": self.counts["fields"],
            "malformed_requests": self.counts["http"],
            "events_dropped": dict(self.events.dropped),
            "future_dated": dict(sorted(self.future_dated.items())),
            "auth": self.auth.stats() if self.auth else None,
        }

    def write_metrics(self, *, read_slurm: bool = True) -> Path | None:
        """Rewrite the controller's textfile (one ``scontrol show nodes`` when ``read_slurm``)."""
        if self.metrics_dir is None:
            return None
        now = self.clock()
        admission = self.decider.admission
        window = admission.breaker.window_s if admission.breaker else 600.0
        breaker = breaker_state(admission.record, now=now, window_s=window)
        nodes = None
        if read_slurm:
            try:
                nodes = control.node_states(admission.slurm, timeout=admission.timeout)
            except GpuforgeError as exc:
                log.warning("fleet metrics without Slurm's view: %s", exc)
        status = fleet_status(self.fleet, self.store, nodes, now=now)
        text = controller_metrics(status, breaker) + self.intake_metrics()
        return write_textfile(self.metrics_dir, text)

    def intake_metrics(self) -> str:
        """The collector's own counters in Prometheus text format (the controller's textfile)."""
        with self._lock:
            counts = dict(self.counts)
            future = sorted(self.future_dated.items())
        dropped = dict(self.events.dropped)
        return render(
            [
                Family(
                    "gpuforge_collector_refused_records_total",
                    "Records refused, by why (malformed, forged, future-dated).",
                    "counter",
                    [({"why": k}, counts[k]) for k in ("malformed", "forged", "future")],
                ),
                Family.single(
                    "gpuforge_collector_refused_fields_total",
                    "Fields refused alone in stored records (a time that is not one, a number "
                    "beyond 64 bits: set to null or left out; a string clipped).",
                    counts["fields"],
                    "counter",
                ),
                Family.single(
                    "gpuforge_collector_malformed_requests_total",
                    "HTTP requests refused before a record was read (framing, size, path, method).",
                    counts["http"],
                    "counter",
                ),
                Family(
                    "gpuforge_collector_events_dropped_total",
                    "Events not stored, by the cap that dropped them.",
                    "counter",
                    [({"limit": k}, v) for k, v in sorted(dropped.items())],
                ),
                Family(
                    "gpuforge_collector_future_records_total",
                    "Records refused as dated ahead of the collector's clock, by node (the node's "
                    "clock is wrong).",
                    "counter",
                    [({"node": n}, v) for n, v in future],
                ),
            ]
        )

    def _tick(self) -> None:
        while not self._stop.wait(60.0):
            try:
                self.write_metrics()
            except Exception as exc:
                log.warning("controller metrics not written: %s", exc)


def _request_line(request: Any) -> str:
    """``METHOD PATH`` of a (maybe partial) waitress request; "" before its first line came."""
    if request is None:
        return ""
    command, path = getattr(request, "command", ""), getattr(request, "path", "")
    if not command:  # headers not complete: the first line as far as it came
        first = bytes(getattr(request, "header_plus", b"") or b"").split(b"\r\n", 1)[0]
        command, _, rest = first.decode("latin-1").partition(" ")
        path = rest.rsplit(" HTTP/", 1)[0]
    return _one_line(f"{command} {path}".strip(), 200)


def _one_line(text: str, limit: int = 1000) -> str:
    """``text`` safe for one log line: control characters escaped, at most ``limit`` long."""
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit * 2])
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _json_response(
    start_response: StartResponse, status: int, body: Mapping[str, Any], *, error: bool = False
) -> list[bytes]:
    data = json.dumps(body, sort_keys=True).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    line = f"{status} {HTTPStatus(status).phrase}"
    if error:  # PEP 3333: a second start_response, before anything was sent, carries exc_info
        start_response(line, headers, sys.exc_info())
    else:
        start_response(line, headers)
    return [data]


def wsgi_app(collector: Collector) -> WSGIApplication:
    """The collector's HTTP endpoints as a WSGI application (it never raises)."""

    def refuse(start_response: StartResponse, peer: str, status: int, error: str) -> list[bytes]:
        with collector._lock:
            collector.counts["http"] += 1
        log.warning("%s: refused a request (%d): %s", peer, status, _one_line(error))
        return _json_response(start_response, status, {"error": error})

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        peer = str(environ.get("REMOTE_ADDR", "?"))
        method, path = str(environ.get("REQUEST_METHOD")), str(environ.get("PATH_INFO"))
        try:
            if path == "/v1/healthz" and method == "GET":
                return _json_response(start_response, HTTPStatus.OK, collector.healthz())
            if path not in ("/v1/healthz", "/v1/records"):
                return refuse(start_response, peer, HTTPStatus.NOT_FOUND, f"no {path}")
            if method != "POST" or path != "/v1/records":
                allowed = "GET" if path == "/v1/healthz" else "POST"
                return refuse(start_response, peer, HTTPStatus.METHOD_NOT_ALLOWED,
                              f"{path} takes {allowed}, not {method}")  # fmt: skip
            length = environ.get("CONTENT_LENGTH")
            if not length:  # the server checked that a Content-Length given is digits
                return refuse(start_response, peer, HTTPStatus.LENGTH_REQUIRED,
                              "Content-Length required")  # fmt: skip
            body = environ["wsgi.input"].read(int(length))
            credential = environ.get("HTTP_" + MUNGE_HEADER.upper().replace("-", "_"))
            sent = environ.get("HTTP_" + SENT_HEADER.upper().replace("-", "_"))
            answer = collector.receive(
                body,
                peer,
                None if credential is None else str(credential),
                None if sent is None else str(sent),
            )
            # The collector's clock in every answer, a refusal too: the node measures its own
            # clock against it (its node.clock check), with or without an NTP client.
            timed = {**answer.body, CLOCK_KEY: round(collector.clock(), 6)}
            return _json_response(start_response, answer.status, timed)
        except Exception as exc:  # a bug of ours: one line, and the node sends the record again
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else "?"
            log.error("%s: %s %s failed: %s: %s (%s)", peer, method, path,
                      type(exc).__name__, _one_line(str(exc)), where)  # fmt: skip
            error = {"error": f"internal error: {type(exc).__name__}"}
            return _json_response(start_response, 500, error, error=True)

    return app


class _QueueLog:
    """waitress's "Task queue depth" warning (one a request in a burst), at most one a minute."""

    def __init__(self) -> None:
        self._last = 0.0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last >= 60.0:
            self._last = now
            log.info("http: every worker busy (%s)", message % args)


class _WaitressLog:
    """waitress's own log calls as one line each on the collector's log, never a traceback.

    Its "Client disconnected while serving" is left out: the channel has said it (one line).
    """

    def log(self, level: int, message: str, *args: object, **_: object) -> None:
        text = message % args if args else message
        if text.startswith("Client disconnected while serving"):
            return
        exc = sys.exc_info()[1]
        if exc is not None and level >= logging.ERROR:
            text += f": {type(exc).__name__}: {exc}"
        log.log(level, "http: %s", _one_line(text))

    def debug(self, message: str, *args: object, **kw: object) -> None:
        self.log(logging.DEBUG, message, *args, **kw)

    def info(self, message: str, *args: object, **kw: object) -> None:
        self.log(logging.INFO, message, *args, **kw)

    def warning(self, message: str, *args: object, **kw: object) -> None:
        self.log(logging.WARNING, message, *args, **kw)

    def error(self, message: str, *args: object, **kw: object) -> None:
        self.log(logging.ERROR, message, *args, **kw)

    def exception(self, message: str, *args: object, **kw: object) -> None:
        self.log(logging.ERROR, message, *args, **kw)

    critical = error


_WAITRESS_LOG = _WaitressLog()


class _Parser(HTTPRequestParser):  # type: ignore[misc]  # waitress has no type hints
    """waitress's parser, with a Content-Length too long for an int answered 400 too."""

    def parse_header(self, header_plus: bytes) -> None:
        try:
            super().parse_header(header_plus)
        except ValueError as exc:  # int() of 5,000 digits: beyond Python's conversion limit
            raise ParsingError(f"Content-Length is invalid ({exc})") from None


class _ErrorTask(ErrorTask):  # type: ignore[misc]
    """A request waitress refused before the application (framing, size): JSON and one line."""

    def execute(self) -> None:
        error = self.request.error
        peer = self.channel.addr[0] if self.channel.addr else "?"
        collector: Collector = self.channel.server.collector
        with collector._lock:
            collector.counts["http"] += 1
        log.warning("%s: refused a request (%d %s): %s", peer, error.code, error.reason,
                    _one_line(str(error.body)))  # fmt: skip
        body = json.dumps({"error": f"{error.reason}: {error.body}"}, sort_keys=True).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Task(WSGITask):  # type: ignore[misc]
    """A request's task: marks its request answered as the answer's last bytes go out."""

    def write(self, data: bytes) -> None:
        length = self.content_length
        if length is not None and self.content_bytes_written + len(data) >= length:
            self.channel.answered = self.request  # the client may read it and close at once
        super().write(data)


class _Channel(HTTPChannel):  # type: ignore[misc]
    """One connection: a client that goes away or stalls is one log line, never a traceback."""

    parser_class = _Parser
    task_class = _Task
    error_task_class = _ErrorTask
    answered: object = None
    logger = _WAITRESS_LOG
    _gone = False
    #: An error other than a disconnect sending the answer (waitress closes on it, silently).
    _reset: str | None = None

    def _flush_exception(self, flush: Any, do_close: bool = True) -> Any:
        if not flush:
            return None
        try:
            return flush(do_close=do_close), False
        except Exception as exc:  # waitress closes, saying nothing: one line when it closes
            self._reset = f"{type(exc).__name__}: {_one_line(str(exc), 200)}"
            self.will_close = True
            return False, True

    def handle_close(self) -> None:
        if not self._gone:
            self._gone = True
            self._say_why()
        super().handle_close()

    def _who(self, request: Any) -> str:
        """``ADDR (node) METHOD PATH`` of a connection's request, as far as it is known: the
        node is the one whose management address the connection comes from (the only address
        the collector takes that node's records from)."""
        peer = self.addr[0] if self.addr else "?"
        collector: Collector = self.server.collector
        node = collector.node_at(peer)
        what = f"{peer} ({node})" if node else peer
        line = _request_line(request)
        return f"{what} {line}" if line else what

    def _say_why(self) -> None:
        partial = self.request
        started = partial is not None and bool(partial.header_plus or partial.headers_finished)
        with self.outbuf_lock:  # a worker flushing an answer updates the count under it
            unsent = self.total_outbufs_len
        if self.will_close or self.close_when_flushed:
            # The collector closes it: after an answer that closes the connection (no line: the
            # answer had its own), or a client that sent nothing complete for the idle timeout;
            # unless the answer could not go out (the client reset the connection).
            if started and time.time() - self.last_activity >= self.adj.channel_timeout:
                log.warning("%s: connection closed: no complete request in %s s (%d body bytes)",
                            self._who(partial), self.adj.channel_timeout,
                            self._received(partial))  # fmt: skip
            elif unsent or self._reset is not None:
                self._unsent(unsent)
            return
        if started:
            log.warning("%s: connection closed mid-request (the client went away; %d of %d"
                        " body bytes)", self._who(partial), self._received(partial),
                        partial.content_length)  # fmt: skip
        elif self.requests and self.requests[0] is not self.answered:
            # A request running stores its record; one not yet begun is not run (the node got
            # no answer: it keeps the record in its spool and sends it again).
            log.warning("%s: the client went away before its answer was sent",
                        self._who(self.requests[0]))  # fmt: skip
        elif unsent:
            self._unsent(unsent)

    def _unsent(self, unsent: int) -> None:
        how = f" ({self._reset})" if self._reset else ""
        log.warning("%s: the client went away with %d bytes of its answer unsent%s",
                    self._who(self.answered), unsent, how)  # fmt: skip

    @staticmethod
    def _received(partial: Any) -> int:
        return int(partial.body_bytes_received) if partial.body_rcv is not None else 0

    def handle_error(self) -> None:
        _, value, _ = sys.exc_info()
        log.error("%s: connection closed: %s: %s", self._who(self.request), type(value).__name__,
                  _one_line(str(value)))  # fmt: skip
        self._gone = True
        self.handle_close()


class CollectorServer:
    """The collector's HTTP server (waitress): ``serve_forever``/``shutdown``/``server_close``.

    waitress parses each request in one event loop, with limits on the header and body sizes,
    and hands complete requests to ``threads`` workers running :func:`wsgi_app`; the workers
    wait for the writer's group commit and the decider like the request threads did before.
    """

    def __init__(
        self,
        collector: Collector,
        host: str,
        port: int,
        *,
        threads: int,
        idle_timeout_s: int,
        command: str = "gpuforge health serve",
        held: ExitStack | None = None,
    ) -> None:
        # One writer per history: the lock first (a second collector names the first, even on
        # the same port), held until server_close, dropped by the kernel if this process dies;
        # ``held``: the caller took it already (health serve, before opening anything).
        self._held = held if held is not None else claim_history(collector.store.path, command)
        try:
            self._bind(collector, host, port, threads, idle_timeout_s)
        except BaseException:
            self._held.close()
            raise

    def _bind(
        self, collector: Collector, host: str, port: int, threads: int, idle_timeout_s: int
    ) -> None:
        try:
            adj = _adjustments(host, port, threads, idle_timeout_s)
        except ValueError:  # waitress's word for a host that does not resolve
            raise OSError(f"{host}: not an address to listen on (it does not resolve)") from None
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.logger = _WAITRESS_LOG
        dispatcher.queue_logger = _QueueLog()
        dispatcher.set_thread_count(threads)
        self._map: dict[int, Any] = {}

        class Server(TcpWSGIServer):  # type: ignore[misc]
            channel_class = _Channel
            logger = _WAITRESS_LOG

        try:
            self._server = Server(wsgi_app(collector), map=self._map, dispatcher=dispatcher,
                                  adj=adj, sockinfo=_first_ipv4(adj.listen))  # fmt: skip
        except OSError:
            wasyncore.close_all(self._map)  # the socket and the trigger of a failed bind
            dispatcher.shutdown(timeout=1)  # and no worker threads left behind
            raise
        self._server.collector = collector
        self.server_address: tuple[str, int] = (
            str(self._server.effective_host),
            int(self._server.effective_port),
        )
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._closing = threading.Lock()
        self._closed = False

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown`."""
        self._stopped.clear()
        try:
            while not self._stop.is_set() and self._map:
                wasyncore.loop(timeout=poll_interval, map=self._map, use_poll=True, count=1)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (from another thread) and wait until it has returned.

        The wake-up goes to the loop's trigger only while it is open: SIGTERM's shutdown thread
        can run after the loop ended and :meth:`server_close` closed the trigger, whose file
        descriptor number may already name another file.
        """
        self._stop.set()
        with self._closing:
            if not self._closed:
                self._server.pull_trigger()
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and every connection; stop the workers; let go of the
        history's writer lock."""
        try:
            with self._closing:
                self._closed = True
                wasyncore.close_all(self._map)
            self._server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        finally:
            self._held.close()


def _adjustments(host: str, port: int, threads: int, idle_timeout_s: int) -> Adjustments:
    """waitress's settings for the collector; ValueError when ``host`` does not resolve."""
    return Adjustments(
        host=host,
        port=port,
        threads=threads,
        ident="gpuforge-collector",
        max_request_body_size=MAX_BODY + 1,  # waitress refuses a body of this size or more
        max_request_header_size=MAX_HEADER,
        inbuf_overflow=MAX_BODY + 1,  # a record stays in memory, never in a temporary file
        channel_timeout=idle_timeout_s,  # a slow or idle client is closed
        cleanup_interval=idle_timeout_s / 2,  # looked for this often
        channel_request_lookahead=1,  # read on while a request runs: see a client go away
        connection_limit=CONNECTION_LIMIT,
        backlog=4096,  # slurmd starts every node's check at the same moment
        asyncore_use_poll=True,  # select() stops at 1,024 descriptors
        log_socket_errors=False,  # a client gone is one line from the channel, no traceback
        expose_tracebacks=False,
    )


def _first_ipv4(listen: list[Any]) -> Any:
    """The first IPv4 address a host name resolves to (the nodes post to IPv4), else the first."""
    return next((info for info in listen if info[0] == socket.AF_INET), listen[0])


def make_server(
    collector: Collector,
    host: str,
    port: int,
    *,
    threads: int = THREADS,
    idle_timeout_s: int = IDLE_TIMEOUT_S,
    command: str = "gpuforge health serve",
    held: ExitStack | None = None,
) -> CollectorServer:
    """An HTTP server for ``collector`` bound to ``host:port`` (call ``serve_forever``), holding
    its history's writer lock (:func:`claim_history`: :class:`HistoryHeld` while another
    collector writes it; ``held``: the lock the caller claimed already, closed with the server);
    ``command`` is what the lock says holds it."""
    return CollectorServer(collector, host, port, threads=threads, idle_timeout_s=idle_timeout_s,
                           command=command, held=held)  # fmt: skip


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` or ``ADDR`` (port :data:`DEFAULT_PORT`); InputError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, DEFAULT_PORT
    if not port.isdigit() or int(port) > 65535:
        raise InputError(f"--listen {text!r}: the port must be 0-65535 (0: any free port)")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - the operator asked for all
