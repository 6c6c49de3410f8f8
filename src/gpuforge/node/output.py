"""Where a run's record goes: last-<tier>.json, the textfile metrics, the spool and the collector.

Every file is written atomically (temporary file + rename): node_exporter never reads half a
metrics file, the prolog never reads half a record. The spool keeps undelivered records, at most
``spool_max`` (the oldest are dropped and counted in ``gpuforge_health_spool_dropped_total``);
each run sends the spool oldest first and stops at the first failure, so a collector that is
down costs one timeout per run and never fails the check.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.node.config import CHECKS, HealthConfig
from gpuforge.node.record import Record
from gpuforge.node.state import State, Streak, write_atomic

#: Metric encoding of a status (skip is not written).
STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "error": 3}
SPOOL = "spool"


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


def _labels(**labels: str) -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def metrics_text(
    record: Record, config: HealthConfig, state: State, *, spooled: int, now: float
) -> str:
    """The Prometheus textfile of one tier (names fixed in DAY2.md, "Metrics").

    The passive tier's file also carries the per-check series without a ``tier`` label (shadow,
    drain requested) and the spool's: one file per series, or node_exporter rejects duplicates.
    """
    tier = record.tier
    out: list[str] = []

    def family(name: str, help_text: str, kind: str, rows: Sequence[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {value:g}" for labels, value in rows)

    family(
        "gpuforge_health_check_status",
        "Last status of a health check: 0 pass, 1 warn, 2 fail, 3 error.",
        "gauge",
        [
            (_labels(tier=tier, check=c.check), STATUS_VALUE[c.status])
            for c in record.checks
            if c.status in STATUS_VALUE
        ],
    )
    family(
        "gpuforge_health_verdict",
        "Verdict of the last run of a tier: 0 pass, 1 warn, 2 fail, 3 error.",
        "gauge",
        [(_labels(tier=tier), STATUS_VALUE[record.verdict])],
    )
    family(
        "gpuforge_health_last_run_timestamp_seconds",
        "When the tier last ran (Unix time).",
        "gauge",
        [(_labels(tier=tier), round(now, 3))],
    )
    family(
        "gpuforge_health_run_duration_seconds",
        "Wall time of the tier's last run.",
        "gauge",
        [(_labels(tier=tier), record.duration_s)],
    )
    if tier == "passive":
        family(
            "gpuforge_health_check_shadow",
            "1 when the check runs in shadow mode (recorded, never drains).",
            "gauge",
            [(_labels(check=name), 1 if config.check(name).shadow else 0) for name in CHECKS],
        )
        latched = _latched(state.streaks)
        family(
            "gpuforge_health_drain_requested",
            "1 while the node asks the collector to drain it for this check.",
            "gauge",
            [(_labels(check=name, action=s.action or "quarantine"), 1) for name, s in latched],
        )
        family(
            "gpuforge_health_spool_records",
            "Records waiting in the spool for the collector.",
            "gauge",
            [("", spooled)],
        )
        family(
            "gpuforge_health_spool_dropped_total",
            "Records dropped from a full spool.",
            "counter",
            [("", state.spool_dropped)],
        )
    return "\n".join(out) + "\n"


def _latched(streaks: Mapping[str, Streak]) -> list[tuple[str, Streak]]:
    return sorted((n, s) for n, s in streaks.items() if s.latched)


def write_metrics(
    record: Record, config: HealthConfig, state: State, *, spooled: int, now: float | None = None
) -> Path:
    """``<textfile_dir>/gpuforge_<tier>.prom``, atomically."""
    path = config.textfile_dir / f"gpuforge_{record.tier}.prom"
    text = metrics_text(record, config, state, spooled=spooled, now=now or time.time())
    write_atomic(path, text)
    return path


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
    """What sending the spool did: records sent, the first failure, the last answer."""

    sent: int
    error: str
    answer: Mapping[str, Any] | None


def post(url: str, body: bytes, timeout: float) -> Mapping[str, Any]:
    """POST one record; the collector's JSON answer. Raises OSError/ValueError on failure."""
    request = urllib.request.Request(  # noqa: S310 - the URL's scheme is checked by config.load
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
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


def deliver(config: HealthConfig, *, deadline: float, limit: int | None = None) -> Delivery:
    """Send the spool oldest first until it is empty, a send fails or ``deadline`` (monotonic).

    Each answer is saved as ``decision.json`` (the newest wins). Never raises for the network.
    """
    if config.collector is None:
        return Delivery(0, "no collector configured", None)
    url = config.collector.url + "/v1/records"
    sent = 0
    answer: Mapping[str, Any] | None = None
    for path in spooled(config)[:limit]:
        left = deadline - time.monotonic()
        if left < 0.1:
            return Delivery(sent, "time budget spent", answer)
        try:
            body = path.read_bytes()
        except OSError:
            continue
        try:
            answer = post(url, body, min(config.collector.timeout_s, left))
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                # The collector refused this record for good (corrupt, not ours): keeping it
                # would block the spool forever.
                path.unlink(missing_ok=True)
                continue
            return Delivery(sent, f"{url}: HTTP {exc.code}", answer)
        except (OSError, ValueError) as exc:
            return Delivery(sent, f"{url}: {exc}", answer)
        path.unlink(missing_ok=True)
        sent += 1
        write_atomic(decision_path(config), json.dumps(answer, sort_keys=True) + "\n")
    return Delivery(sent, "", answer)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
