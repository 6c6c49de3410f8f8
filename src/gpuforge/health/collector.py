"""The collector: nodes push their health records here; it stores them and decides on requests.

``gpuforge health serve`` runs one :class:`Collector` per cluster (a systemd service on the
controller; in the lab a background process on the lab network's gateway). HTTP, stdlib only:

* ``POST /v1/records``: one record (``gpuforge.record/1``, parsed by :mod:`gpuforge.node.record`)
  -> ``200 {"decision": {...}}`` (:class:`~gpuforge.health.decide.Decision`); ``400`` a record
  that does not parse (the error names the field), ``403`` a record for a node sent from any
  address but that node's management address (no forged drains), ``411``/``413`` no or too long
  a body, ``503`` the store could not take it (the node keeps it in its spool and sends it again);
* ``GET /v1/healthz``: ``{"status": "ok", ...}`` with queue depths and counts.

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
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Generic, TypeVar

from gpuforge.errors import GpuforgeError, InputError
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
from gpuforge.node.output import MUNGE_HEADER
from gpuforge.node.record import from_json
from gpuforge.slurm import control

log = logging.getLogger(__name__)

#: The collector's port (health.yaml's ``collector.url`` names it).
DEFAULT_PORT = 9477
#: Largest record body accepted: 20 checks with 2,000-character evidence and some counters.
MAX_BODY = 1 << 20
#: Seconds a request waits for its record to be stored / its decision to be made. A node gives
#: up after its own timeout (2 s) and sends the record again with the next run; storing is
#: idempotent for the node's events, and admission's decisions are.
STORE_WAIT_S = 10.0
DECIDE_WAIT_S = 120.0
#: A request older than this (a spooled record sent late) is stored but not acted on: two of
#: slurmd's default 300 s health check intervals.
MAX_REQUEST_AGE_S = 600.0

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
                log.error("%s: batch of %d failed: %s", self._thread.name, len(batch), exc)
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
        clock: Callable[[], float] = time.time,
        auth: Authenticator | None = None,
    ) -> None:
        self.fleet = fleet
        self.auth = auth  # None: the source address alone (tests, conformance's own collector)
        self.max_request_age_s = max_request_age_s
        self.store = store
        self.decider = decider
        self.metrics_dir = metrics_dir
        self.retention = retention or Retention()
        self.clock = clock
        self._writer: _Batcher[tuple[dict[str, Any], str], int] = _Batcher(
            "history-writer", self._store, max_batch
        )
        self._decider: _Batcher[dict[str, Any], Decision] = _Batcher(
            "decider", self.decider.decide, max_batch
        )
        self._pruned = 0.0
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="metrics", daemon=True)
        self.refused = 0

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

    def _store(self, items: list[tuple[dict[str, Any], str]]) -> list[int]:
        records = [r for r, _ in items]
        self.store.ingest(records, received=self.clock(), texts=[t for _, t in items])
        now = self.clock()
        if now - self._pruned >= 3600:
            self._pruned = now
            gone = self.store.prune(self.retention, now=now)
            if any(gone.values()):
                log.info("pruned history: %s", gone)
        return [1] * len(records)

    def receive(  # noqa: PLR0911 - one answer per refusal
        self, body: bytes, peer: str, credential: str | None = None
    ) -> Answer:
        """Handle one posted record from address ``peer`` with its munge ``credential``."""
        try:
            record = from_json(body, "record").to_dict()
        except InputError as exc:
            return Answer(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        node = record["node"]
        expected = self.fleet.addresses.get(node)
        if expected is None:
            return Answer(HTTPStatus.FORBIDDEN, {"error": f"{node} is not a GPU node of "
                                                          f"{self.fleet.name}"})  # fmt: skip
        if peer.removeprefix("::ffff:") != expected:  # an IPv4 peer of a dual-stack socket
            log.warning("refused a record for %s from %s (its address is %s)", node, peer, expected)
            return Answer(
                HTTPStatus.FORBIDDEN,
                {"error": f"a record for {node} is accepted only from {node}'s management address"},
            )
        verdict = self.auth.check(node, expected, body, credential) if self.auth else None
        if verdict is not None and not verdict.ok:
            return Answer(verdict.status, {"error": verdict.error})
        try:
            self._writer.submit((record, body.decode())).result(timeout=STORE_WAIT_S)
        except (InputError, ValueError, TypeError, KeyError) as exc:
            # The record itself cannot be stored: the node drops it rather than resend it forever.
            return Answer(HTTPStatus.BAD_REQUEST, {"error": f"not stored: {exc}"})
        except Exception as exc:
            return Answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not stored: {exc}"})
        age = self.clock() - parse_time(record["started"], "record.started")
        if not record.get("request"):
            decision = Decision(node, "none", "none", detail="no request")
        elif age > self.max_request_age_s:
            # A spooled record sent late (the collector was away): its request may be long out of
            # date (the node rebooted since, or an operator acted); the node's next run asks again
            # if it still holds.
            op = str(record["request"].get("op"))
            decision = Decision(
                node, op, "none", detail=f"stale request: the record is {age:.0f}s old"
            )
        else:
            try:
                decision = self._decider.submit(record).result(timeout=DECIDE_WAIT_S)
            except Exception as exc:
                op = str(record["request"].get("op"))
                decision = Decision(node, op, "error", detail=f"not decided: {exc}")
            self._note(decision)
        return Answer(HTTPStatus.OK, {"decision": decision.to_dict()})

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
        return write_textfile(self.metrics_dir, controller_metrics(status, breaker))

    def _tick(self) -> None:
        while not self._stop.wait(60.0):
            try:
                self.write_metrics()
            except Exception as exc:
                log.warning("controller metrics not written: %s", exc)


def make_server(collector: Collector, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server for ``collector`` bound to ``host:port`` (call ``serve_forever``)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuforge-collector"
        protocol_version = "HTTP/1.1"
        timeout = 10  # a slow client cannot hold a thread

        def _send(self, status: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/healthz":
                self._send(HTTPStatus.OK, collector.healthz())
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/v1/records":
                self.close_connection = True
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no {self.path}"})
                return
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True
                self._send(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
                return
            if int(length) > MAX_BODY:
                self.close_connection = True
                self._send(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    {"error": f"a record is at most {MAX_BODY} bytes, not {length}"},
                )
                return
            body = self.rfile.read(int(length))
            credential = self.headers.get(MUNGE_HEADER)
            answer = collector.receive(body, self.client_address[0], credential)
            self._send(answer.status, answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.client_address[0], *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 4096  # slurmd starts every node's check at the same moment

    return Server((host, port), Handler)


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` or ``ADDR`` (port :data:`DEFAULT_PORT`); InputError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, DEFAULT_PORT
    if not port.isdigit() or int(port) > 65535:
        raise InputError(f"--listen {text!r}: the port must be 0-65535 (0: any free port)")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - the operator asked for all
