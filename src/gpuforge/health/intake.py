"""The collector's intake: a posted body made canonical and bounded before the record parser.

One pass at the edge (:func:`canonical`), before :func:`gpuforge.node.record.from_json`:

* the body is UTF-8 JSON without a byte order mark; a BOM, UTF-16 or UTF-32 (with or without a
  BOM, told by RFC 8259's null-byte pattern) or bytes that are not UTF-8 are refused (400) with
  the encoding named;
* ``NaN``/``Infinity`` tokens, integers beyond SQLite's 64 bits, floats that overflow to
  infinity, nesting deeper than :data:`MAX_DEPTH`, keys over :data:`MAX_KEY` characters,
  duplicate keys and lone surrogates are refused (400) naming the field, except where the schema
  allows the field to be absent: there the field is *refused and named* and the record kept (an
  event's ``code``/``gpu``, a check's ``measured``/``expected`` become null; a counter is left
  out); an integer of more than 4,300 digits (Python's conversion limit) refuses the body;
* strings over :data:`MAX_STRING` characters are clipped (head and tail kept), and named;
* a time the store cannot read (:func:`refuse_times`: not an ISO 8601 string, or beyond what a
  date can show) is refused alone and named: an event's ``time`` becomes null (the event is
  stored at its record's time), the record's ``started`` becomes the collector's receive time.

The result is the record as a dict and the names of what was refused in it. The collector stores
the body as received only when the intake changed nothing in it (it passed every check above),
else the canonical text (:func:`dumps`): no reader meets a BOM, a NaN or an unbounded value.

Event caps (:class:`EventBudget`): at most ``per_record`` events of one record and
``per_node_hour`` of one node in an hour are stored; the rest are counted, not stored (the record
itself is stored).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any

from gpuforge.errors import InputError
from gpuforge.history.store import iso, parse_time
from gpuforge.node.record import clip

#: Deepest nesting of arrays and objects (a record is 3 deep: record > checks > check).
MAX_DEPTH = 16
#: Longest string kept whole (a record's evidence and detail are clipped to 2,000 by the node).
MAX_STRING = 8192
#: Longest object key (a counter's name is about 30 characters).
MAX_KEY = 256
#: SQLite's INTEGER range (what the history store can hold).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: Default event caps (the collector's ``max_events_per_record`` / ``max_events_per_node_hour``).
EVENTS_PER_RECORD = 200
EVENTS_PER_NODE_HOUR = 1000


class Refused(Exception):  # noqa: N818 - a refusal, not a program error
    """The body cannot be taken: ``status`` (an HTTP 4xx) and a message naming why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Intake:
    """A canonical record (decoded, bounded) and the fields refused in it, named."""

    record: dict[str, Any]
    refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Bad:
    """A value the JSON held that the collector cannot take (``NaN``, ``Infinity``)."""

    why: str


# (path pattern) -> what to do with a bad value there: "null" (the schema allows null) or "drop"
# (the key is optional). "*" matches any list index or key. Anywhere else a bad value refuses the
# whole record.
_FALLBACK: dict[tuple[str, ...], str] = {
    ("events", "*", "code"): "null",
    ("events", "*", "gpu"): "null",
    ("checks", "*", "measured"): "null",
    ("checks", "*", "expected"): "null",
    ("counters", "*"): "drop",
}


def encoding_problem(body: bytes) -> str | None:
    """Why ``body`` is not BOM-less UTF-8 (the encoding named), or None when it is."""
    boms = (
        (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with a byte order mark)"),
        (b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with a byte order mark)"),
        (b"\xef\xbb\xbf", "UTF-8 with a byte order mark"),
        (b"\xfe\xff", "UTF-16 (big-endian, with a byte order mark)"),
        (b"\xff\xfe", "UTF-16 (little-endian, with a byte order mark)"),
    )
    for bom, name in boms:
        if body.startswith(bom):
            return name
    # RFC 8259 (and 4627 section 3): JSON text starts with an ASCII character, so the pattern of
    # zero bytes in the first four tells UTF-16/32 without a BOM.
    zeros = tuple(not byte for byte in body[:4])
    patterns = (
        ((True, True, True, False), "UTF-32 (big-endian)"),
        ((False, True, True, True), "UTF-32 (little-endian)"),
        ((True, False), "UTF-16 (big-endian)"),
        ((False, True), "UTF-16 (little-endian)"),
    )
    for pattern, name in patterns:
        if zeros[: len(pattern)] == pattern:
            return name
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})"
    return None


def _constant(token: str) -> _Bad:
    return _Bad(f"{token} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Refused(f"record: the key {key[:MAX_KEY]!r} appears twice in one object")
            seen.add(key)
    return out


def canonical(body: bytes) -> Intake:
    """``body`` decoded, checked and bounded; :class:`Refused` (400) when it cannot be taken."""
    if not body.strip():
        raise Refused("record: the body is empty")
    problem = encoding_problem(body)
    if problem:
        raise Refused(f"record: the body is {problem}: a record is UTF-8 JSON without a BOM")
    try:
        data = json.loads(
            body.decode("utf-8"),
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except RecursionError:
        raise Refused(f"record: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4,300 digits too (Python's limit)
        raise Refused(f"record: not valid JSON: {exc}") from None
    refused: list[str] = []
    return Intake(_walk(data, (), refused), tuple(refused))


def _where(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "record"


def _fallback(path: tuple[str | int, ...]) -> str | None:
    for pattern, action in _FALLBACK.items():
        if len(pattern) == len(path) and all(
            p == "*" or p == str(q) for p, q in zip(pattern, path, strict=True)
        ):
            return action
    return None


_DROP = object()


def _walk(value: Any, path: tuple[str | int, ...], refused: list[str]) -> Any:
    if isinstance(value, dict | list):
        if len(path) >= MAX_DEPTH:
            raise Refused(f"record: {_where(path)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, list):
            items = (_walk(item, (*path, i), refused) for i, item in enumerate(value))
            return [item for item in items if item is not _DROP]
        out: dict[str, Any] = {}
        for key, item in value.items():
            if len(key) > MAX_KEY or not _utf8(key):
                raise Refused(
                    f"record: {_where(path)}: a key of {len(key)} characters"
                    f" (at most {MAX_KEY}, UTF-8)"
                )
            if _plain(item):  # the common case, without building the item's path
                out[key] = item
                continue
            kept = _walk(item, (*path, key), refused)
            if kept is not _DROP:
                out[key] = kept
        return out
    why = _problem(value)
    if why is None:
        if isinstance(value, str) and len(value) > MAX_STRING:
            refused.append(f"{_where(path)}: clipped from {len(value)} characters")
            return clip(value, MAX_STRING)
        return value
    action = _fallback(path)
    if action is None:
        raise Refused(f"record: {_where(path)}: {why}")
    refused.append(f"{_where(path)}: {why}: {'left out' if action == 'drop' else 'set to null'}")
    return _DROP if action == "drop" else None


def refuse_times(record: object, now: float) -> list[str]:
    """Refuse, one by one, the times of ``record`` (a decoded body) the store cannot read.

    The record is changed in place: a ``started`` that is not a time (``"yesterday"``, a number,
    a date no calendar shows) becomes ``now`` (the collector's receive time), an event's ``time``
    becomes null (the store dates it at its record's time). Returns what was refused, named, for
    the answer's ``refused`` list; the rest of the record is stored as sent.
    """
    if not isinstance(record, dict):
        return []  # the record parser names what is wrong with it
    notes = []
    if "started" in record and not _readable_time(record["started"]):
        notes.append(
            f"started: {_shown(record['started'])} is not an ISO 8601 time: the collector's"
            f" receive time {iso(now)} used"
        )
        record["started"] = iso(now)
    events = record.get("events")
    for i, event in enumerate(events if isinstance(events, list) else []):
        if not isinstance(event, dict) or event.get("time") is None:
            continue
        if not _readable_time(event["time"]):
            notes.append(
                f"events[{i}].time: {_shown(event['time'])} is not an ISO 8601 time: set to null"
            )
            event["time"] = None
    return notes


#: The epoch seconds a reader can show again as a date (0001-01-01 to 9999-12-31, UTC).
_SHOWN = (-62135596800.0, 253402300799.0)


def _readable_time(value: object) -> bool:
    """An ISO 8601 string the store parses and every reader can show again (:func:`iso`)."""
    if not isinstance(value, str):
        return False
    try:
        at = parse_time(value, "time")
    except (InputError, ValueError, OverflowError):
        return False
    return _SHOWN[0] <= at <= _SHOWN[1]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _plain(value: object) -> bool:
    """A scalar that needs nothing done: None, a bool, a short ASCII string, an int64, a float."""
    if isinstance(value, str):
        return len(value) <= MAX_STRING and value.isascii()
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return INT_MIN <= value <= INT_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    return False


def _problem(value: object) -> str | None:
    """Why a JSON scalar cannot be stored, or None."""
    if isinstance(value, _Bad):
        return value.why
    if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        digits = str(value)
        shown = digits if len(digits) <= 30 else f"an integer of {len(digits.lstrip('-'))} digits"
        return f"{shown} is beyond a 64-bit integer"
    if isinstance(value, float) and not math.isfinite(value):
        return "a number too large for a 64-bit float"
    if isinstance(value, str) and not _utf8(value):
        return "a string with a lone surrogate (not UTF-8)"
    return None


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dumps(record: dict[str, Any]) -> str:
    """The canonical text stored for ``record``: compact JSON, UTF-8 (never a BOM, NaN or Inf)."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class EventBudget:
    """Events kept per record and per node and clock hour; thread-safe.

    :meth:`take` says how many of a record's events may be stored and counts the rest by the
    limit that dropped them (``per_record``, ``per_node_hour``).
    """

    def __init__(
        self, per_record: int = EVENTS_PER_RECORD, per_node_hour: int = EVENTS_PER_NODE_HOUR
    ) -> None:
        self.per_record = per_record
        self.per_node_hour = per_node_hour
        self.dropped = {"per_record": 0, "per_node_hour": 0}
        self._used: dict[str, tuple[int, int]] = {}  # node -> (hour, events kept in it)
        self._lock = threading.Lock()

    def take(self, node: str, offered: int, now: float) -> int:
        """How many of ``offered`` events of ``node``'s record to keep (the first ones)."""
        hour = int(now // 3600)
        with self._lock:
            at, used = self._used.get(node, (hour, 0))
            if at != hour:
                used = 0
            kept = min(offered, self.per_record)
            self.dropped["per_record"] += offered - kept
            room = max(self.per_node_hour - used, 0)
            if kept > room:
                self.dropped["per_node_hour"] += kept - room
                kept = room
            self._used[node] = (hour, used + kept)
            return kept
