"""Hysteresis, shadow and kill switch on the node: streaks in state.json, the request computed."""

from __future__ import annotations

import json
from pathlib import Path

from gpuforge.node import config as cfg
from gpuforge.node import engine
from gpuforge.node import state as st
from gpuforge.node.record import Request, verdict_of
from gpuforge.validate.result import CheckResult


def _config(extra: str = "") -> cfg.HealthConfig:
    return cfg.parse(f"version: 1\nnode: gpu01\n{extra}")


def _run(
    config: cfg.HealthConfig, state: st.State, *results: CheckResult
) -> tuple[list[str], Request | None]:
    checks, request = engine.hysteresis(list(results), config, state, update=True)
    return [f"{c.check}:{c.status}:{c.streak}" for c in checks], request


FAIL = CheckResult(
    "", "fabric.counters", "fail", "ib/mlx5_0/1/symbol_error +50 > 10", action="inspect"
)
PASS = CheckResult("", "fabric.counters", "pass")
ERROR = CheckResult("", "fabric.counters", "error", message="counters absent")


def test_fail_after_two_needs_two_consecutive_fails() -> None:
    config = _config()  # fabric.counters: fail_after 2, pass_after 3
    state = st.State()
    assert _run(config, state, FAIL) == (["fabric.counters:fail:1"], None)
    assert _run(config, state, PASS)[1] is None  # the streak starts again
    assert _run(config, state, FAIL)[1] is None
    checks, request = _run(config, state, FAIL)
    assert checks == ["fabric.counters:fail:2"]
    assert request == Request("drain", "fabric.counters", "inspect", 0)


def test_error_neither_drains_nor_breaks_a_streak() -> None:
    config = _config()
    state = st.State()
    _run(config, state, FAIL)
    assert _run(config, state, ERROR)[1] is None
    assert _run(config, state, FAIL)[1] == Request("drain", "fabric.counters", "inspect", 0)
    # Latched: an ERROR does not resume either.
    assert _run(config, state, ERROR)[1] == Request("drain", "fabric.counters", "inspect", 0)


def test_pass_after_three_then_resume_until_answered() -> None:
    config = _config()
    state = st.State()
    _run(config, state, FAIL)
    _run(config, state, FAIL)
    assert _run(config, state, PASS)[1] is not None
    assert _run(config, state, PASS)[1] is not None
    assert _run(config, state, PASS)[1] == Request("resume")
    assert _run(config, state, PASS)[1] == Request("resume")  # until the collector answers
    state.resume_pending = False
    assert _run(config, state, PASS)[1] is None


def test_shadow_check_is_recorded_but_never_drains_nor_counts() -> None:
    config = _config("checks:\n  gpu.xid: {shadow: true}\n")
    state = st.State()
    xid = CheckResult("", "gpu.xid", "fail", "79@0000:91:00=reboot", action="reboot")
    checks, request = engine.hysteresis([xid], config, state, update=True)
    assert request is None
    assert checks[0].shadow is True
    assert checks[0].status == "fail"
    assert verdict_of(checks) == "pass"


def test_kill_switch_drops_a_latched_drain() -> None:
    state = st.State()
    xid = CheckResult("", "gpu.xid", "fail", action="reboot")
    assert _run(_config(), state, xid)[1] == Request("drain", "gpu.xid", "reboot", 0)
    killed = _config("checks:\n  gpu.xid: {enabled: false}\n")
    checks, request = _run(
        killed, state, CheckResult("", "gpu.xid", "skip", message=engine.DISABLED)
    )
    assert request == Request("resume")
    assert checks == ["gpu.xid:skip:0"]


def test_strongest_action_leads_the_drain_request() -> None:
    state = st.State()
    config = _config()
    _, request = _run(
        config,
        state,
        CheckResult("", "software.versions", "fail", action="quarantine"),
        CheckResult("", "gpu.xid", "fail", action="reboot"),
        CheckResult("", "gpu.model", "fail", action="inspect"),
    )
    assert request == Request("drain", "gpu.model", "inspect", 2)


def test_warn_and_monitor_never_drain() -> None:
    state = st.State()
    _, request = _run(_config(), state, CheckResult("", "gpu.xid", "warn", action="monitor"))
    assert request is None


def test_state_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = st.State(boot_id="b1", kmsg_cursor="2026-11-30T19:00:00+00:00")
    state.streak("gpu.xid").fails = 2
    state.counters["ib/mlx5_0/1/symbol_error"] = [[1.0, 5.0]]
    st.save(path, state)
    again = st.load(path)
    assert again.streak("gpu.xid").fails == 2
    assert again.kmsg_cursor == state.kmsg_cursor
    assert again.counters == state.counters
    path.write_text("{not json")
    fresh = st.load(path)
    assert fresh.streaks == {}
    assert "unreadable" in fresh.note


def test_the_clock_measurement_round_trips_and_a_bad_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = st.State()
    state.streak("gpu.xid").fails = 1
    state.clock = st.Clock(offset_s=-12.5, rtt_s=0.004, at=1795000000.0)
    st.save(path, state)
    assert st.load(path).clock == state.clock
    for bad in ({"offset_s": "x", "rtt_s": 0, "at": 0}, {"offset_s": 1e999}, [1, 2], "now"):
        doc = json.loads(path.read_text())
        doc["clock"] = bad
        path.write_text(json.dumps(doc))
        again = st.load(path)
        # Only the measurement is lost (node.clock skips), not the streaks.
        assert again.clock is None and again.streak("gpu.xid").fails == 1


def test_prolog_acts_on_a_cached_drain_of_this_boot_only_while_fresh(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from gpuforge.node import output  # noqa: PLC0415
    from gpuforge.node.record import Record  # noqa: PLC0415

    config = cfg.parse(f"version: 1\nnode: gpu01\nstate_dir: {tmp_path}\n")
    started = datetime(2026, 11, 30, 19, 0, tzinfo=UTC)
    passive = Record(
        node="gpu01",
        tier="passive",
        started="2026-11-30T19:00:00Z",
        duration_s=1.0,
        verdict="fail",
        checks=(CheckResult("", "fabric.port", "fail", action="inspect", streak=2),),
        request=Request("drain", "fabric.port", "inspect", 0),
    )
    output.write_last(config, passive)
    (tmp_path / "decision.json").write_text('{"decision": {"done": "drained"}}')
    st.save(tmp_path / "state.json", st.State(boot_id="b1"))
    prolog = Record("gpu01", "prolog", "2026-11-30T19:05:00Z", 0.1, "pass")

    def blocks(boot: str | None, age: timedelta) -> int:
        return engine.prolog_blocks(prolog, config, current_boot=boot, now=started + age)

    assert blocks("b1", timedelta(minutes=5)) == 1
    assert blocks("b2", timedelta(minutes=5)) == 0  # another boot
    assert blocks(None, timedelta(minutes=5)) == 0  # boot unknown
    assert blocks("b1", timedelta(hours=2)) == 0  # stale cache
    (tmp_path / "decision.json").write_text('{"decision": {"done": "refused"}}')
    assert blocks("b1", timedelta(minutes=5)) == 0  # the breaker's refusal stands


def test_no_resume_while_another_check_fails_below_its_threshold() -> None:
    config = _config()  # gpu.xid: fail_after 1; fabric.counters: fail_after 2
    state = st.State()
    xid_fail = CheckResult("", "gpu.xid", "fail", action="reboot")
    xid_pass = CheckResult("", "gpu.xid", "pass")
    assert _run(config, state, xid_fail, PASS)[1] == Request("drain", "gpu.xid", "reboot", 0)
    # The Xid is gone (say, after the reboot), but the counters fail once: not latched, yet the
    # node must not ask to return with a failing check.
    assert _run(config, state, xid_pass, FAIL)[1] is None
    assert _run(config, state, xid_pass, PASS)[1] == Request("resume")
