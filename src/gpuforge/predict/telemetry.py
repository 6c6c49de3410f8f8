"""The fleet telemetry format: versioned JSON Lines (docs/predictive.md, "Telemetry format").

What ``gpuforge fleet export-telemetry`` writes and ``gpuforge fleet risk --telemetry`` reads (the
collector's SQLite store, :mod:`gpuforge.history`, is another thing: the history). The first line
is the header ``{"schema": "gpuforge.telemetry/1"}`` (``gpuforge.history/1``, what earlier
versions wrote, is read as the same format); every other line is one of

* a sample ``{"time", "node", "gpu", "port", "metric", "value"}`` (``metric`` named as
  dcgm-exporter and node_exporter name it: ``DCGM_FI_DEV_GPU_TEMP``,
  ``node_infiniband_symbol_error_total``; ``gpu`` an index or null, ``port`` ``device/port``
  or null);
* an event ``{"time", "node", "gpu", "event", "code"?, "detail"?}`` with ``event`` one of
  :data:`EVENTS`;
* a node's topology labels ``{"node", "labels": {"rack", "leaf", "node_type"}}`` (the peer
  groups; optional: a node without labels is compared with the whole fleet).

``time`` is RFC 3339 (``2026-11-30T19:20:00Z``). A malformed line is reported with its line
number and either refused (:class:`InputError`, exit 2) or skipped and counted, per ``on_error``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import numpy.typing as npt

from gpuforge.errors import InputError

#: The header this gpuforge writes.
SCHEMA = "gpuforge.telemetry/1"
#: The same format under its earlier name (files exported before the rename): read, never written.
LEGACY_SCHEMA = "gpuforge.history/1"
#: The headers the reader accepts.
SCHEMAS = (SCHEMA, LEGACY_SCHEMA)
#: The event kinds a telemetry file may hold.
EVENTS = ("xid", "drain", "resume", "remediation", "rma", "failure")
#: The topology labels that define peer groups.
LABELS = ("rack", "leaf", "node_type")

OnError = Literal["skip", "fail"]
FloatArray = npt.NDArray[np.float64]

_SAMPLE_KEYS = frozenset({"time", "node", "gpu", "port", "metric", "value"})
_EVENT_KEYS = frozenset({"time", "node", "gpu", "event", "code", "detail"})
_EVENT_REQUIRED = frozenset({"time", "node", "gpu", "event"})


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """One time series: a metric of a node, for one GPU, one port, or the node as a whole."""

    node: str
    metric: str
    gpu: int | None = None
    port: str | None = None

    @property
    def subject(self) -> str:
        """``gpu3``, ``mlx5_0/1`` or ``node``: what the series measures."""
        if self.gpu is not None:
            return f"gpu{self.gpu}"
        return self.port if self.port is not None else "node"


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a node (an Xid, a drain, a failure, ...)."""

    time: float
    node: str
    event: str
    gpu: int | None = None
    code: int | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one telemetry line."""
        out: dict[str, Any] = {
            "time": format_time(self.time),
            "node": self.node,
            "gpu": self.gpu,
            "event": self.event,
        }
        if self.code is not None:
            out["code"] = self.code
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True, slots=True)
class LineError:
    """A malformed line: its number and what is wrong with it."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class Telemetry:
    """Series (time-sorted arrays), events and labels of a fleet; what the scorer reads."""

    series: dict[SeriesKey, tuple[FloatArray, FloatArray]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    skipped: list[LineError] = field(default_factory=list)
    lines: int = 0
    source: str = ""

    @property
    def nodes(self) -> list[str]:
        """Every node that has a sample, an event or labels, sorted."""
        names = {k.node for k in self.series} | {e.node for e in self.events} | set(self.labels)
        return sorted(names)

    @property
    def end(self) -> float | None:
        """The latest time in the telemetry (samples and events), or None when it is empty."""
        ends = [float(t[-1]) for t, _ in self.series.values() if len(t)]
        ends += [e.time for e in self.events]
        return max(ends) if ends else None


def format_time(epoch: float) -> str:
    """RFC 3339 in UTC with a ``Z``; whole seconds unless the time has a fraction."""
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    text = moment.isoformat(timespec="seconds" if epoch == int(epoch) else "milliseconds")
    return text.replace("+00:00", "Z")


def parse_time(text: object, what: str = "time") -> float:
    """Epoch seconds of an RFC 3339 time; a zone is required (``Z`` or an offset)."""
    if not isinstance(text, str):
        raise ValueError(f"{what}: must be an RFC 3339 string, not {type(text).__name__}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{what}: {text!r} has no time zone (add Z or an offset)")
    return moment.timestamp()


def _gpu(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"gpu: must be a GPU index (integer >= 0) or null, not {value!r}")
    return value


def _name(record: Mapping[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: must be a non-empty string, not {value!r}")
    return value


def _parse(record: object) -> tuple[str, Any]:
    """Classify and validate one decoded line: ("sample"|"event"|"labels"|"header", value)."""
    if not isinstance(record, dict):
        raise ValueError(f"a line must be a JSON object, not {type(record).__name__}")
    if "schema" in record:
        return "header", record["schema"]
    if "labels" in record:
        return "labels", _parse_labels(record)
    if "event" in record:
        return "event", _parse_event(record)
    extra = set(record) - _SAMPLE_KEYS
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: unknown field of a sample")
    missing = _SAMPLE_KEYS - set(record)
    if missing:
        raise ValueError(f"{sorted(missing)[0]}: missing (a sample needs {', '.join(_keys())})")
    value = record["value"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"value: must be a finite number, not {value!r}")
    port = record["port"]
    if port is not None and (not isinstance(port, str) or not port):
        raise ValueError(f"port: must be a string (device/port) or null, not {port!r}")
    key = SeriesKey(_name(record, "node"), _name(record, "metric"), _gpu(record["gpu"]), port)
    return "sample", (key, parse_time(record["time"]), float(value))


def _parse_labels(record: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    extra = set(record) - {"node", "labels"}
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: unknown field of a labels line")
    labels = record["labels"]
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ValueError("labels: must map label names to strings")
    return _name(record, "node"), dict(labels)


def _parse_event(record: Mapping[str, Any]) -> Event:
    extra = set(record) - _EVENT_KEYS
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: unknown field of an event")
    missing = _EVENT_REQUIRED - set(record)
    if missing:
        raise ValueError(f"{sorted(missing)[0]}: missing")
    kind = record["event"]
    if kind not in EVENTS:
        raise ValueError(f"event: {kind!r} is not one of {', '.join(EVENTS)}")
    code = record.get("code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise ValueError(f"code: must be an integer, not {code!r}")
    detail = record.get("detail", "")
    if not isinstance(detail, str):
        raise ValueError(f"detail: must be a string, not {detail!r}")
    return Event(
        time=parse_time(record["time"]),
        node=_name(record, "node"),
        event=kind,
        gpu=_gpu(record["gpu"]),
        code=code,
        detail=detail,
    )


def _keys() -> list[str]:
    return ["time", "node", "gpu", "port", "metric", "value"]


class _Builder:
    """Accumulates parsed lines into a :class:`Telemetry`."""

    def __init__(self, source: str) -> None:
        self.telemetry = Telemetry(source=source)
        self._points: dict[SeriesKey, tuple[list[float], list[float]]] = {}

    def add(self, kind: str, value: Any) -> None:
        if kind == "sample":
            key, t, v = value
            times, values = self._points.setdefault(key, ([], []))
            times.append(t)
            values.append(v)
        elif kind == "event":
            self.telemetry.events.append(value)
        elif kind == "labels":
            node, labels = value
            self.telemetry.labels.setdefault(node, {}).update(labels)

    def done(self) -> Telemetry:
        for key, (times, values) in self._points.items():
            t = np.asarray(times, dtype=np.float64)
            v = np.asarray(values, dtype=np.float64)
            if len(t) > 1 and bool(np.any(np.diff(t) < 0)):
                order = np.argsort(t, kind="stable")
                t, v = t[order], v[order]
            self.telemetry.series[key] = (t, v)
        self.telemetry.events.sort(key=lambda e: e.time)
        return self.telemetry


def read_lines(lines: Iterable[str], *, source: str, on_error: OnError = "fail") -> Telemetry:
    """Parse telemetry lines (the first must be the header). ``source`` names them in errors.

    ``on_error="fail"`` raises :class:`InputError` at the first malformed line; ``"skip"``
    records it in :attr:`Telemetry.skipped` (never silently) and goes on. A missing or foreign
    header is always refused: the rest could not be trusted.
    """
    builder = _Builder(source)
    seen_header = False
    count = 0
    for number, raw in enumerate(lines, start=1):
        count = number
        text = raw.strip()
        if not text:
            continue
        try:
            kind, value = _parse(json.loads(text))
        except (ValueError, RecursionError) as exc:
            message = str(exc) if not isinstance(exc, json.JSONDecodeError) else f"not JSON: {exc}"
            if not seen_header:
                raise InputError(
                    f'{source}:{number}: expected the header {{"schema": "{SCHEMA}"}} ({message})'
                ) from None
            if on_error == "fail":
                raise InputError(f"{source}:{number}: {message}") from None
            builder.telemetry.skipped.append(LineError(number, message))
            continue
        if kind == "header":
            if value not in SCHEMAS:
                raise InputError(
                    f"{source}:{number}: schema: {value!r} is not {SCHEMA!r} (this gpuforge "
                    f"reads version 1, also under its earlier name {LEGACY_SCHEMA!r})"
                )
            seen_header = True
            continue
        if not seen_header:
            raise InputError(f'{source}:{number}: expected the header {{"schema": "{SCHEMA}"}}')
        builder.add(kind, value)
    if not seen_header:
        raise InputError(f"{source}: empty telemetry file (no header line)")
    telemetry = builder.done()
    telemetry.lines = count
    return telemetry


def read_telemetry(path: Path, *, on_error: OnError = "fail") -> Telemetry:
    """Read a telemetry file (``-`` is not accepted here; the CLI handles stdin)."""
    try:
        with path.open(encoding="utf-8") as handle:
            return read_lines(handle, source=str(path), on_error=on_error)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the telemetry file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None


def sample_line(key: SeriesKey, time: float, value: float) -> str:
    """One sample as a telemetry line."""
    number: float | int = int(value) if float(value).is_integer() else value
    return json.dumps(
        {
            "time": format_time(time),
            "node": key.node,
            "gpu": key.gpu,
            "port": key.port,
            "metric": key.metric,
            "value": number,
        },
        separators=(",", ":"),
    )


def telemetry_lines(telemetry: Telemetry) -> Iterator[str]:
    """Every line of ``telemetry`` in the format: header, labels, samples by series, events."""
    yield json.dumps({"schema": SCHEMA})
    for node in sorted(telemetry.labels):
        yield json.dumps({"node": node, "labels": telemetry.labels[node]}, sort_keys=True)
    for key, (times, values) in telemetry.series.items():
        for t, v in zip(times.tolist(), values.tolist(), strict=True):
            yield sample_line(key, t, v)
    for event in telemetry.events:
        yield json.dumps(event.to_json(), separators=(",", ":"))


def write_telemetry(telemetry: Telemetry, out: IO[str]) -> int:
    """Write ``telemetry`` to ``out``; return the number of lines."""
    count = 0
    for line in telemetry_lines(telemetry):
        out.write(line + "\n")
        count += 1
    return count
