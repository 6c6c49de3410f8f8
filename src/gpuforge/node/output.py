"""Where a run's record goes: last-<tier>.json, the textfile metrics, the spool and the collector.

Every file is written atomically (temporary file + rename): node_exporter never reads half a
metrics file, the prolog never reads half a record. The spool keeps undelivered records, at most
``spool_max`` (the oldest are dropped and counted in ``gpuforge_health_spool_dropped_total``);
each run sends the spool oldest first and stops at the first failure, so a collector that is
down costs one timeout per run and never fails the check.

Each record is sent with a munge credential (header ``X-Gpuforge-Munge``, docs/health.md,
"Authentication"), encoded when it is sent (a spooled record gets a fresh one: credentials live
300 s) as the user the checker runs as (root), whose payload names the node, the sha256 of the
exact body and the node's next sequence number (``<state_dir>/sequence``). One process at a time
sends (``<state_dir>/.send.lock``), so the collector sees a node's sequence rise. When munge is
missing or fails the record goes without a credential, the collector decides, and one line on
stderr says why. Each record also carries the node's clock as it is sent (header
``X-Gpuforge-Sent``): how old a spooled record is, on one clock (the collector acts on no
request of a record taken long before it was sent).

Every answer of the collector carries its clock (``collector_time``, epoch seconds, also on a
refusal): the delivery measures the node's clock against it, half the round trip corrected
(:class:`~gpuforge.node.state.Clock`), and the tier keeps the last measurement in ``state.json``
for the ``node.clock`` check of the next run. No NTP client is asked: it works wherever the
collector answers, chrony or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.node.commands import Budget, Runner, ToolError
from gpuforge.node.config import CHECKS, HealthConfig
from gpuforge.node.record import Record
from gpuforge.node.state import Clock, State, Streak, write_atomic
from gpuforge.textfile import Family, Sample, render, write

#: Metric encoding of a status (skip is not written).
STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "error": 3}
SPOOL = "spool"
#: The request header that carries a record's munge credential.
MUNGE_HEADER = "X-Gpuforge-Munge"
#: The request header that carries the node's clock as it sends a record (epoch seconds): with
#: the record's ``started`` (the same clock) it says how old the record is, however far the
#: node's clock is off (the collector's stale-request rule reads munge's encode time instead
#: when the record is authenticated).
SENT_HEADER = "X-Gpuforge-Sent"
#: Seconds ``munge`` may take (it answers in milliseconds from the local munged).
MUNGE_TIMEOUT_S = 1.0
#: The payload's schema: ``{"v": 1, "node": ..., "sha256": ..., "seq": ...}``.
MUNGE_PAYLOAD_VERSION = 1
SEQUENCE = "sequence"
#: The key of the collector's clock (epoch seconds) in each of its answers.
CLOCK_KEY = "collector_time"
SEND_LOCK = ".send.lock"
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/=]{1,8192}:")


def last_path(config: HealthConfig, tier: str) -> Path:
    """``<state_dir>/last-<tier>.json``."""
    return config.state_dir / f"last-{tier}.json"


def decision_path(config: HealthConfig) -> Path:
    """``<state_dir>/decision.json``: the collector's last answer."""
    return config.state_dir / "decision.json"


def write_last(config: HealthConfig, record: Record) -> Path:
    """The run's record as ``last-<tier>.json``."""
    path = last_path(config, record.tier)
    write_atomic(path, record.to_json() + "\n")
    return path


def metrics_text(
    record: Record, config: HealthConfig, state: State, *, spooled: int, now: float
) -> str:
    """The Prometheus textfile of one tier (names fixed in docs/health.md, "Outputs").

    The passive tier's file also carries the per-check series without a ``tier`` label (shadow,
    drain requested) and the spool's: one file per series, or node_exporter rejects duplicates.
    """
    tier = record.tier
    out: list[Family] = []

    def family(name: str, help_text: str, kind: str, rows: Sequence[Sample]) -> None:
        out.append(Family(name, help_text, kind, rows))

    family(
        "gpuforge_health_check_status",
        "Last status of a health check: 0 pass, 1 warn, 2 fail, 3 error.",
        "gauge",
        [
            ({"tier": tier, "check": c.check}, STATUS_VALUE[c.status])
            for c in record.checks
            if c.status in STATUS_VALUE
        ],
    )
    family(
        "gpuforge_health_verdict",
        "Verdict of the last run of a tier: 0 pass, 1 warn, 2 fail, 3 error.",
        "gauge",
        [({"tier": tier}, STATUS_VALUE[record.verdict])],
    )
    family(
        "gpuforge_health_last_run_timestamp_seconds",
        "When the tier last ran (Unix time).",
        "gauge",
        [({"tier": tier}, round(now, 3))],
    )
    family(
        "gpuforge_health_run_duration_seconds",
        "Wall time of the tier's last run.",
        "gauge",
        [({"tier": tier}, record.duration_s)],
    )
    if tier == "passive":
        family(
            "gpuforge_health_check_shadow",
            "1 when the check runs in shadow mode (recorded, never drains).",
            "gauge",
            [({"check": name}, 1 if config.check(name).shadow else 0) for name in CHECKS],
        )
        latched = _latched(state.streaks)
        family(
            "gpuforge_health_drain_requested",
            "1 while the node asks the collector to drain it for this check.",
            "gauge",
            [({"check": name, "action": s.action or "quarantine"}, 1) for name, s in latched],
        )
        family(
            "gpuforge_health_spool_records",
            "Records waiting in the spool for the collector.",
            "gauge",
            [({}, spooled)],
        )
        family(
            "gpuforge_health_spool_dropped_total",
            "Records dropped from a full spool.",
            "counter",
            [({}, state.spool_dropped)],
        )
    return render(out)


def _latched(streaks: Mapping[str, Streak]) -> list[tuple[str, Streak]]:
    return sorted((n, s) for n, s in streaks.items() if s.latched)


def write_metrics(
    record: Record, config: HealthConfig, state: State, *, spooled: int, now: float | None = None
) -> Path:
    """``<textfile_dir>/gpuforge_<tier>.prom``, atomically."""
    path = config.textfile_dir / f"gpuforge_{record.tier}.prom"
    return write(path, metrics_text(record, config, state, spooled=spooled, now=now or time.time()))


# --- spool and delivery --------------------------------------------------------------------------


def spool_dir(config: HealthConfig) -> Path:
    """``<state_dir>/spool``."""
    return config.state_dir / SPOOL


def spooled(config: HealthConfig) -> list[Path]:
    """The spool's records, oldest first."""
    folder = spool_dir(config)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))


def spool(config: HealthConfig, record: Record, state: State) -> Path:
    """Add ``record`` to the spool; drop the oldest beyond ``spool_max`` (counted in state)."""
    folder = spool_dir(config)
    stamp = f"{time.time_ns():020d}"
    path = folder / f"{stamp}-{record.tier}.json"
    write_atomic(path, record.to_json() + "\n")
    waiting = spooled(config)
    for old in waiting[: max(0, len(waiting) - config.spool_max)]:
        with contextlib.suppress(OSError):
            old.unlink()
            state.spool_dropped += 1
    return path


@dataclass(frozen=True, slots=True)
class Delivery:
    """What sending the spool did: records sent, the first failure, the last answer, why
    records went without a munge credential (empty when every one had it) and the clock
    measured on the last answer that carried the collector's (None: no answer did)."""

    sent: int
    error: str
    answer: Mapping[str, Any] | None
    unsigned: str = ""
    clock: Clock | None = None


def post(
    url: str, body: bytes, timeout: float, headers: Mapping[str, str] | None = None
) -> Mapping[str, Any]:
    """POST one record; the collector's JSON answer. Raises OSError/ValueError on failure."""
    request = urllib.request.Request(  # noqa: S310 - the URL's scheme is checked by config.load
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    # No proxy: the collector is on the management network, and an http_proxy in slurmd's
    # environment must not route a drain request elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        raw = response.read(1_000_000)
    answer = json.loads(raw or b"{}")
    if not isinstance(answer, dict):
        raise ValueError("the collector's answer is not a JSON object")
    return answer


def next_sequence(config: HealthConfig, *, now: float | None = None) -> int:
    """The node's next sequence number, saved in ``<state_dir>/sequence`` before it is used.

    Above the last one and never below the clock in milliseconds, so a node whose state
    directory was wiped (reinstalled) still counts on from where it was. The caller holds the
    send lock.
    """
    path = config.state_dir / SEQUENCE
    try:
        last = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        last = 0
    seq = max(last + 1, int((time.time() if now is None else now) * 1000))
    write_atomic(path, f"{seq}\n", mode=0o600)
    return seq


def munge_payload(node: str, body: bytes, seq: int) -> str:
    """What the credential vouches for: the node, the body's sha256 and the sequence."""
    digest = hashlib.sha256(body).hexdigest()
    doc = {"v": MUNGE_PAYLOAD_VERSION, "node": node, "sha256": digest, "seq": seq}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def seal(
    config: HealthConfig, body: bytes, *, deadline: float, socket: Path | None = None
) -> tuple[str | None, str]:
    """A munge credential for ``body`` (the next sequence number in its payload), or None and
    why not (munge missing, munged down, out of time)."""
    left = deadline - time.monotonic()
    try:
        seq = next_sequence(config)
    except OSError as exc:
        return None, f"the sequence file is not writable ({exc.strerror or exc})"
    argv = ["munge", "--string", munge_payload(config.node, body, seq)]
    if socket is not None:
        argv += ["--socket", str(socket)]
    try:
        out = Runner(Budget(left), cap_s=MUNGE_TIMEOUT_S).run(argv)
    except ToolError as exc:
        detail = exc.output.strip().splitlines()[-1:] if exc.output else []
        return None, f"munge: {exc.why}" + (f": {detail[0][:200]}" if detail else "")
    credential = out.stdout.strip()
    if not _CREDENTIAL.fullmatch(credential):
        return None, f"munge printed no credential ({credential[:80]!r})"
    return credential, ""


def _send_lock(config: HealthConfig, deadline: float) -> int | None:
    """A descriptor holding ``<state_dir>/.send.lock`` (one sender per node, so that its
    sequence reaches the collector in order), or None when another run holds it past
    ``deadline``. Closing the descriptor releases the lock."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(config.state_dir / SEND_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() + 0.05 >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
        except OSError:
            os.close(fd)
            raise


def _error_body(exc: urllib.error.HTTPError) -> Mapping[str, Any]:
    """The JSON object of a refusal's body ({} when it has none)."""
    try:
        doc = json.loads(exc.read(10_000) or b"{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _refusal(code: int, doc: Mapping[str, Any]) -> str:
    error = doc.get("error", "")
    return f"HTTP {code}" + (f": {str(error)[:200]}" if error else "")


def clock_sample(answer: Mapping[str, Any] | None, sent_at: float, rtt_s: float) -> Clock | None:
    """The node's clock against the collector's from one answer: the collector's clock less
    the node's at the middle of the round trip (``sent_at``: the node's epoch when the request
    left, ``rtt_s``: the round trip, monotonic); None when the answer has no clock."""
    value = answer.get(CLOCK_KEY) if answer is not None else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    middle = sent_at + rtt_s / 2
    return Clock(round(float(value) - middle, 6), round(rtt_s, 6), round(middle, 3))


def deliver(
    config: HealthConfig,
    *,
    deadline: float,
    limit: int | None = None,
    munge_socket: Path | None = None,
) -> Delivery:
    """Send the spool oldest first until it is empty, a send fails or ``deadline`` (monotonic).

    Each record gets a fresh munge credential (``munge_socket``: munged's socket, default
    munge's own). Each answer is saved as ``decision.json`` (the newest wins). A record refused
    as unauthenticated (401) stays in the spool: the next run sends it with a new credential.
    Never raises for the network.
    """
    if config.collector is None:
        return Delivery(0, "no collector configured", None)
    try:
        fd = _send_lock(config, deadline)
    except OSError as exc:
        return Delivery(0, f"the send lock is not usable ({exc.strerror or exc})", None)
    if fd is None:
        return Delivery(0, "another run is sending the spool", None)
    try:
        delivery = _send(config, deadline=deadline, limit=limit, munge_socket=munge_socket)
    finally:
        os.close(fd)
    if delivery.unsigned:
        sys.stderr.write(f"gpuforge-node: records sent without a credential: {delivery.unsigned}\n")
    return delivery


def _send(
    config: HealthConfig, *, deadline: float, limit: int | None, munge_socket: Path | None
) -> Delivery:
    assert config.collector is not None  # noqa: S101 - checked by deliver
    url = config.collector.url + "/v1/records"
    sent = 0
    unsigned = ""
    answer: Mapping[str, Any] | None = None
    clock: Clock | None = None
    for path in spooled(config)[:limit]:
        if deadline - time.monotonic() < 0.1:
            return Delivery(sent, "time budget spent", answer, unsigned, clock)
        try:
            body = path.read_bytes()
        except OSError:
            continue
        credential, why = seal(config, body, deadline=deadline, socket=munge_socket)
        unsigned = unsigned or why
        left = deadline - time.monotonic()
        sent_at, start = time.time(), time.monotonic()
        headers = {SENT_HEADER: f"{sent_at:.3f}"}
        if credential:
            headers[MUNGE_HEADER] = credential
        try:
            answer = post(url, body, min(config.collector.timeout_s, max(left, 0.05)), headers)
        except urllib.error.HTTPError as exc:
            doc = _error_body(exc)
            clock = clock_sample(doc, sent_at, time.monotonic() - start) or clock
            if 400 <= exc.code < 500 and exc.code not in (401, 408, 429):
                # The collector refused this record for good (corrupt, not ours): keeping it
                # would block the spool forever.
                path.unlink(missing_ok=True)
                continue
            return Delivery(sent, f"{url}: {_refusal(exc.code, doc)}", answer, unsigned, clock)
        except (OSError, ValueError) as exc:
            return Delivery(sent, f"{url}: {exc}", answer, unsigned, clock)
        clock = clock_sample(answer, sent_at, time.monotonic() - start) or clock
        path.unlink(missing_ok=True)
        sent += 1
        write_atomic(decision_path(config), json.dumps(answer, sort_keys=True) + "\n")
    return Delivery(sent, "", answer, unsigned, clock)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
