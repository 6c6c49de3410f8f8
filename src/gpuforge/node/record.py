"""The health record: what one run of the node checker found, sent from the node to the collector.

One definition for both ends: the node builds a :class:`Record` and writes :meth:`Record.to_json`;
the controller's collector parses what it receives with :func:`from_json`, which refuses a corrupt
record with an :class:`~gpuforge.errors.InputError` naming the field
(``record: checks[2].status: must be one of pass, warn, fail, error, skip``).

Schema ``gpuforge.record/1`` (docs/health.md, "The record", fixes it):

* ``verdict`` is the worst status of the checks that are not in shadow mode, in the order
  pass < warn < error < fail (an ERROR never outranks a FAIL and never drains); shadowed and
  skipped checks do not count; no counted check at all is ``pass``.
* ``request`` is what the node asks the collector to do: ``drain`` (a non-shadow check failed
  ``fail_after`` runs in a row), ``resume`` (every check that had asked for the drain has passed
  ``pass_after`` runs in a row), or null. The collector decides whether to act.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuforge.errors import InputError
from gpuforge.validate.result import (
    CheckResult,
    Measured,
    NodeVerdict,
    Status,
    bound_evidence,
    decide,
)
from gpuforge.validate.xid_catalogue import Action

SCHEMA = "gpuforge.record/1"
TIERS = ("passive", "prolog", "epilog", "conformance")
#: Record verdicts: a record never has a ``skip`` verdict.
VERDICTS = ("pass", "warn", "fail", "error")
#: Severity order for the verdict: error never outranks fail (an ERROR never drains a node).
RANK = {"skip": -1, "pass": 0, "warn": 1, "error": 2, "fail": 3}
#: Actions a check may name: the Xid catalogue's, plus admission's ``quarantine`` (repair and
#: re-validate) for failures the catalogue does not cover (a version off its pin, a dead service).
ACTIONS = (*(a.value for a in Action), "quarantine")
REQUEST_OPS = ("drain", "resume")
DRIFT_KINDS = ("package", "file", "sysctl", "module", "service", "limit", "slurm", "firmware")
#: Longest text field kept in a record (evidence, detail): a record stays small on the wire.
TEXT_MAX = 2000


def check_dict(c: CheckResult) -> dict[str, Any]:
    """One check of a record in the record's JSON form: no node (the record names it), the
    result's ``message`` as ``detail``, no action as ``null``."""
    return {
        "check": c.check,
        "status": c.status.value,
        "action": c.action or None,
        "measured": c.measured,
        "expected": c.expected,
        "detail": c.message,
        "evidence": c.evidence,
        "shadow": c.shadow,
        "streak": c.streak,
    }


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """Something dated that happened on the node: an Xid, a link going down."""

    event: str
    time: str | None = None
    gpu: int | None = None
    code: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "time": self.time,
            "gpu": self.gpu,
            "event": self.event,
            "code": self.code,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Drift:
    """One item whose actual state differs from the state a role recorded (conformance)."""

    kind: str
    item: str
    desired: str
    actual: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "kind": self.kind,
            "item": self.item,
            "desired": self.desired,
            "actual": self.actual,
        }


@dataclass(frozen=True, slots=True)
class Request:
    """What the node asks the collector to do (the collector decides through admission)."""

    op: str
    check: str | None = None
    action: str | None = None
    #: Other checks that also ask for the drain (the reason's ``+N``).
    more: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"op": "resume"}`` carries no check."""
        if self.op == "resume":
            return {"op": "resume"}
        return {"op": self.op, "check": self.check, "action": self.action, "more": self.more}


@dataclass(frozen=True, slots=True)
class Record:
    """One run of the node checker (or of the conformance task).

    ``checks``: each check's :class:`~gpuforge.validate.result.CheckResult` (``streak`` and
    ``shadow`` set by the hysteresis); a check built on the node without its node's name
    (``node=""``) gets the record's.
    """

    node: str
    tier: str
    started: str
    duration_s: float
    verdict: str
    checks: tuple[CheckResult, ...] = ()
    level: str | None = None
    job_id: str | None = None
    config_digest: str | None = None
    counters: Mapping[str, int | float] = field(default_factory=dict)
    events: tuple[NodeEvent, ...] = ()
    drift: tuple[Drift, ...] = ()
    request: Request | None = None
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        if any(not c.node for c in self.checks):
            named = tuple(c if c.node else replace(c, node=self.node) for c in self.checks)
            object.__setattr__(self, "checks", named)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema :data:`SCHEMA`)."""
        return {
            "schema": self.schema,
            "node": self.node,
            "tier": self.tier,
            "level": self.level,
            "started": self.started,
            "duration_s": self.duration_s,
            "job_id": self.job_id,
            "config_digest": self.config_digest,
            "verdict": self.verdict,
            "checks": [check_dict(c) for c in self.checks],
            "counters": dict(self.counters),
            "events": [e.to_dict() for e in self.events],
            "drift": [d.to_dict() for d in self.drift],
            "request": self.request.to_dict() if self.request else None,
        }

    def to_json(self) -> str:
        """One line of JSON (keys in schema order)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def check(self, name: str) -> CheckResult | None:
        """The outcome of check ``name`` in this run, or None when it did not run."""
        return next((c for c in self.checks if c.check == name), None)


def node_verdict(
    node: str, checks: Iterable[CheckResult], *, first: str | None = None
) -> NodeVerdict:
    """The admission verdict of ``node``'s checks: the one way from a record to the
    :class:`~gpuforge.validate.result.NodeVerdict` that :class:`~gpuforge.admission.Admission`
    takes (the health collector's drains, nightly conformance).

    Shadowed checks do not count (``first`` always does: the node asked); the verdict rules are
    the acceptance levels' (:func:`~gpuforge.validate.result.decide`: a FAIL quarantines with its
    catalogue action, an ERROR holds, else admit). ``first``: the check the node asked to be
    drained for, named first in the reasons and the results (the drain reason carries it).

    The verdict's results are ``node``'s, as one run's facts: a FAIL keeps its action (a WARN's
    ``monitor`` is dropped), and the record's hysteresis (``shadow``, ``streak``) is left out.
    """
    counted = [c for c in checks if not c.shadow or c.check == first]
    counted.sort(key=lambda c: c.check != first)  # stable: the rest keep their order
    results = [
        replace(
            c,
            node=node,
            action=c.action if c.status is Status.FAIL else "",
            shadow=False,
            streak=1,
        )
        for c in counted
    ]
    return decide(node, results)


def verdict_of(checks: Sequence[CheckResult]) -> str:
    """The worst status among non-shadow, non-skipped checks (pass < warn < error < fail)."""
    worst = "pass"
    for c in checks:
        if c.shadow or c.status == "skip":
            continue
        if RANK[c.status] > RANK[worst]:
            worst = c.status
    return worst


def clip(text: str, limit: int = TEXT_MAX) -> str:
    """``text`` cut to ``limit`` characters, keeping its head and its tail
    (:func:`~gpuforge.validate.result.bound_evidence`)."""
    return bound_evidence(text, limit)


# --- parsing -------------------------------------------------------------------------------------


class _Reader:
    """Typed field access that names the field in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, why: str) -> InputError:
        return InputError(f"{self.source}: {where}: {why}")

    def obj(
        self, value: object, where: str, keys: Sequence[str], required: Sequence[str]
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where or "record", "must be a JSON object")
        unknown = sorted(set(value) - set(keys))
        if unknown:
            raise self.fail(_join(where, unknown[0]), f"unknown field (known: {', '.join(keys)})")
        for key in required:
            if key not in value:
                raise self.fail(_join(where, key), "missing")
        return value

    def text(
        self, data: Mapping[str, Any], key: str, where: str, *, null: bool = False
    ) -> str | None:
        value = data.get(key)
        if value is None and null:
            return None
        if not isinstance(value, str):
            raise self.fail(_join(where, key), "must be a string" + (" or null" if null else ""))
        return value

    def req_text(
        self, data: Mapping[str, Any], key: str, where: str, *, empty: bool = False
    ) -> str:
        value = self.text(data, key, where)
        assert value is not None  # noqa: S101 - text() without null never returns None
        if not empty and not value.strip():
            raise self.fail(_join(where, key), "must not be empty")
        return value

    def choice(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        allowed: Sequence[str],
        *,
        null: bool = False,
    ) -> str | None:
        value = data.get(key)
        if value is None and null:
            return None
        if value not in allowed:
            raise self.fail(
                _join(where, key),
                f"must be one of {', '.join(allowed)}"
                + (" or null" if null else "")
                + f" (got {value!r})",
            )
        return str(value)

    def integer(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        *,
        minimum: int = 0,
        null: bool = False,
        default: int | None = None,
    ) -> int | None:
        if key not in data and default is not None:
            return default
        value = data.get(key)
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(
                _join(where, key), f"must be an integer >= {minimum}" + (" or null" if null else "")
            )
        return value

    def number(self, data: Mapping[str, Any], key: str, where: str) -> float:
        value = data.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise self.fail(_join(where, key), "must be a number >= 0")
        return float(value)

    def flag(self, data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(_join(where, key), "must be true or false")
        return value

    def scalar(self, data: Mapping[str, Any], key: str, where: str) -> Measured:
        value = data.get(key)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise self.fail(_join(where, key), "must be a string, number, boolean or null")
        return value

    def array(self, data: Mapping[str, Any], key: str, where: str) -> list[Any]:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise self.fail(_join(where, key), "must be a list")
        return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


_RECORD_KEYS = (
    "schema", "node", "tier", "level", "started", "duration_s", "job_id", "config_digest",
    "verdict", "checks", "counters", "events", "drift", "request",
)  # fmt: skip
_CHECK_KEYS = (
    "check",
    "status",
    "action",
    "measured",
    "expected",
    "detail",
    "evidence",
    "shadow",
    "streak",
)
_EVENT_KEYS = ("time", "gpu", "event", "code", "detail")
_DRIFT_KEYS = ("kind", "item", "desired", "actual")
_REQUEST_KEYS = ("op", "check", "action", "more")


def from_dict(data: object, source: str = "record") -> Record:
    """Validate a decoded record; any problem is an :class:`InputError` naming the field."""
    r = _Reader(source)
    d = r.obj(
        data,
        "",
        _RECORD_KEYS,
        ("schema", "node", "tier", "started", "duration_s", "verdict", "checks"),
    )
    if d["schema"] != SCHEMA:
        raise r.fail("schema", f"must be {SCHEMA!r} (got {d['schema']!r})")
    node = r.req_text(d, "node", "")
    checks = tuple(
        _check(r, raw, f"checks[{i}]", node) for i, raw in enumerate(r.array(d, "checks", ""))
    )
    counters = d.get("counters", {})
    if not isinstance(counters, dict):
        raise r.fail("counters", "must be an object of numbers")
    for key, value in counters.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise r.fail(f"counters.{key}", "must be a number")
    events = tuple(_event(r, raw, f"events[{i}]") for i, raw in enumerate(r.array(d, "events", "")))
    drift = tuple(_drift(r, raw, f"drift[{i}]") for i, raw in enumerate(r.array(d, "drift", "")))
    request = None if d.get("request") is None else _request(r, d["request"], "request")
    verdict = r.choice(d, "verdict", "", VERDICTS)
    assert verdict is not None  # noqa: S101 - choice() without null never returns None
    tier = r.choice(d, "tier", "", TIERS)
    assert tier is not None  # noqa: S101
    return Record(
        node=node,
        tier=tier,
        level=r.text(d, "level", "", null=True),
        started=r.req_text(d, "started", ""),
        duration_s=r.number(d, "duration_s", ""),
        job_id=_job_id(r, d),
        config_digest=r.text(d, "config_digest", "", null=True),
        verdict=verdict,
        checks=checks,
        counters=dict(counters),
        events=events,
        drift=drift,
        request=request,
    )


def _job_id(r: _Reader, d: Mapping[str, Any]) -> str | None:
    value = d.get("job_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # a job id written as a number is still the job's id
    return r.text(d, "job_id", "", null=True)


def _check(r: _Reader, raw: object, where: str, node: str) -> CheckResult:
    """One check of ``node``'s record."""
    d = r.obj(raw, where, _CHECK_KEYS, ("check", "status"))
    status = r.choice(d, "status", where, tuple(s.value for s in Status))
    assert status is not None  # noqa: S101
    streak = r.integer(d, "streak", where, minimum=0, default=1)
    assert streak is not None  # noqa: S101
    return CheckResult(
        node=node,
        check=r.req_text(d, "check", where),
        status=Status(status),
        action=r.choice(d, "action", where, ACTIONS, null=True) or "",
        measured=r.scalar(d, "measured", where),
        expected=r.scalar(d, "expected", where),
        message=r.text(d, "detail", where, null=True) or "",
        evidence=r.text(d, "evidence", where, null=True) or "",
        shadow=r.flag(d, "shadow", where, False),
        streak=streak,
    )


def _event(r: _Reader, raw: object, where: str) -> NodeEvent:
    d = r.obj(raw, where, _EVENT_KEYS, ("event",))
    return NodeEvent(
        event=r.req_text(d, "event", where),
        time=r.text(d, "time", where, null=True),
        gpu=r.integer(d, "gpu", where, null=True),
        code=r.integer(d, "code", where, null=True),
        detail=r.text(d, "detail", where, null=True) or "",
    )


def _drift(r: _Reader, raw: object, where: str) -> Drift:
    d = r.obj(raw, where, _DRIFT_KEYS, ("kind", "item", "desired", "actual"))
    kind = r.choice(d, "kind", where, DRIFT_KINDS)
    assert kind is not None  # noqa: S101
    return Drift(
        kind=kind,
        item=r.req_text(d, "item", where),
        desired=r.req_text(d, "desired", where, empty=True),
        actual=r.req_text(d, "actual", where, empty=True),
    )


def _request(r: _Reader, raw: object, where: str) -> Request:
    d = r.obj(raw, where, _REQUEST_KEYS, ("op",))
    op = r.choice(d, "op", where, REQUEST_OPS)
    if op == "resume":
        return Request(op="resume")
    more = r.integer(d, "more", where, default=0)
    assert more is not None  # noqa: S101
    action = r.choice(d, "action", where, ACTIONS)
    if action is not None and not _drains(action):
        raise r.fail(_join(where, "action"), f"{action!r} does not drain a node")
    return Request(op="drain", check=r.req_text(d, "check", where), action=action, more=more)


def _drains(action: str) -> bool:
    return action == "quarantine" or Action(action).drains


def checks_of(raw: Mapping[str, Any]) -> tuple[CheckResult, ...]:
    """The checks of a decoded record the collector already took, leniently: an entry without
    a name is skipped, a status outside the vocabulary reads as ``error`` (never drains)."""
    node = str(raw.get("node") or "")
    out = []
    for c in raw.get("checks") or []:
        if not isinstance(c, Mapping) or not c.get("check"):
            continue
        try:
            status = Status(str(c.get("status")))
        except ValueError:
            status = Status.ERROR
        action = c.get("action")
        out.append(
            CheckResult(
                node=node,
                check=str(c["check"]),
                status=status,
                action=str(action) if action else "",
                measured=c.get("measured"),
                expected=c.get("expected"),
                message=str(c.get("detail") or ""),
                evidence=str(c.get("evidence") or ""),
                shadow=bool(c.get("shadow", False)),
            )
        )
    return tuple(out)


def from_json(text: str | bytes, source: str = "record") -> Record:
    """Parse and validate one JSON record (what the collector receives, what the node caches)."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: not valid JSON: {exc}") from None
    return from_dict(data, source)
