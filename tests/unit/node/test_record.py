"""The record format: round trip, verdict rule, and corrupt records refused naming the field."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.node import record as rec
from gpuforge.validate.result import CheckResult


def _record() -> rec.Record:
    checks = (
        CheckResult(
            "", "gpu.xid", "fail", "79@PCI:0000:91:00=reboot", "no hardware Xid", action="reboot"
        ),
        CheckResult("", "fabric.counters", "error", message="counters absent"),
        CheckResult("", "gpu.throttle", "warn", action="monitor", shadow=True),
    )
    return rec.Record(
        node="gpu01",
        tier="passive",
        started="2026-11-30T19:20:00Z",
        duration_s=1.8,
        verdict=rec.verdict_of(checks),
        checks=checks,
        config_digest="sha256:00",
        counters={"ib/mlx5_0/1/symbol_error": 0},
        events=(rec.NodeEvent("xid", "2026-11-30T19:19:00Z", 3, 79, "fallen off the bus"),),
        request=rec.Request("drain", "gpu.xid", "reboot", 0),
    )


def test_round_trip() -> None:
    r = _record()
    assert rec.from_json(r.to_json()) == r
    data = json.loads(r.to_json())
    assert data["schema"] == "gpuforge.record/1"
    assert list(data) == list(rec._RECORD_KEYS)


def test_checks_carry_the_record_node_and_the_wire_form_is_unchanged() -> None:
    r = _record()
    assert {c.node for c in r.checks} == {"gpu01"}  # built on the node with node=""
    data = json.loads(r.to_json())
    assert data["checks"][1] == {
        "check": "fabric.counters",
        "status": "error",
        "action": None,
        "measured": None,
        "expected": None,
        "detail": "counters absent",
        "evidence": "",
        "shadow": False,
        "streak": 1,
    }
    back = rec.from_json(r.to_json())
    assert back.checks[1].message == "counters absent" and back.checks[1].action == ""
    assert rec.checks_of(data)[0] == replace(back.checks[0], streak=1)


def test_node_verdict_keeps_a_fail_action_only_and_no_hysteresis() -> None:
    checks = (
        CheckResult("", "gpu.xid", "fail", action="reboot", streak=2),
        CheckResult("", "gpu.throttle", "warn", action="monitor"),
        CheckResult("", "fabric.port", "fail", action="inspect", shadow=True),
    )
    v = rec.node_verdict("gpu01", checks)
    assert (v.verdict, v.reasons, v.warnings, v.action) == (
        "quarantine",
        ("gpu.xid",),
        ("gpu.throttle",),
        "reboot",
    )
    assert [(c.node, c.check, c.action, c.shadow, c.streak) for c in v.results] == [
        ("gpu01", "gpu.xid", "reboot", False, 1),
        ("gpu01", "gpu.throttle", "", False, 1),
    ]
    first = rec.node_verdict("gpu01", checks, first="fabric.port")
    assert first.reasons == ("fabric.port", "gpu.xid") and first.action == "inspect"


@pytest.mark.parametrize(
    ("statuses", "shadow", "verdict"),
    [
        ((), (), "pass"),
        (("pass", "warn"), (False, False), "warn"),
        (("fail", "error"), (False, False), "fail"),
        (("error", "warn"), (False, False), "error"),
        (("fail", "pass"), (True, False), "pass"),
        (("skip",), (False,), "pass"),
    ],
)
def test_verdict_is_worst_non_shadow(
    statuses: tuple[str, ...], shadow: tuple[bool, ...], verdict: str
) -> None:
    checks = [
        CheckResult("", f"c{i}", s, shadow=sh)
        for i, (s, sh) in enumerate(zip(statuses, shadow, strict=True))
    ]
    assert rec.verdict_of(checks) == verdict


def _mutate(path: str, value: Any) -> str:
    data = json.loads(_record().to_json())
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("schema", "gpuforge.record/2", "record: schema: must be 'gpuforge.record/1'"),
        ("tier", "hourly", "record: tier: must be one of passive"),
        ("verdict", "skip", "record: verdict: must be one of"),
        (
            "checks.1.status",
            "broken",
            "record: checks[1].status: must be one of pass, warn, fail, error, skip",
        ),
        ("checks.0.streak", -1, "record: checks[0].streak: must be an integer >= 0"),
        ("checks.0.action", "explode", "record: checks[0].action: must be one of"),
        ("checks.0.measured", [1], "record: checks[0].measured: must be a string"),
        (
            "counters.ib/mlx5_0/1/symbol_error",
            "3",
            "record: counters.ib/mlx5_0/1/symbol_error: must be a number",
        ),
        ("events.0.gpu", "three", "record: events[0].gpu: must be an integer"),
        ("request.op", "reboot", "record: request.op: must be one of drain, resume"),
        ("request.action", "monitor", "record: request.action: 'monitor' does not drain"),
        ("duration_s", -1, "record: duration_s: must be a number >= 0"),
        ("node", "", "record: node: must not be empty"),
        ("extra", 1, "record: extra: unknown field"),
    ],
)
def test_corrupt_record_names_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(InputError) as err:
        rec.from_json(_mutate(path, value))
    assert message in str(err.value)


def test_missing_field_and_bad_json() -> None:
    data = json.loads(_record().to_json())
    del data["checks"][0]["status"]
    with pytest.raises(InputError, match=r"checks\[0\]\.status: missing"):
        rec.from_dict(data)
    with pytest.raises(InputError, match="not valid JSON"):
        rec.from_json("{")
    with pytest.raises(InputError, match="must be a JSON object"):
        rec.from_json("[]")


def test_resume_request_and_numeric_job_id() -> None:
    data = json.loads(_record().to_json())
    data["request"] = {"op": "resume"}
    data["job_id"] = 4242
    r = rec.from_dict(data)
    assert r.request == rec.Request("resume")
    assert r.job_id == "4242"
    assert r.to_dict()["request"] == {"op": "resume"}
