"""Decisions on node requests: admission's rules, the breaker under a burst, strict resumes."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from gpuforge.admission import Admission
from gpuforge.health.decide import Decider, DecisionPolicy
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict

from ..history.records import T0, record
from .conftest import MakeDecider, fleet

OPERATOR = "bad DIMM, ticket 4711"


def drain_request(node: str, check: str = "gpu.xid", action: str = "reboot") -> dict[str, Any]:
    return record(
        node,
        verdict="fail",
        failed=((check, action),),
        request={"op": "drain", "check": check, "action": action, "more": 0},
    )


def resume_request(node: str, passing: str = "gpu.xid") -> dict[str, Any]:
    rec = record(node, request={"op": "resume"})
    rec["checks"].append({**rec["checks"][0], "check": passing})
    return rec


def test_a_drain_request_drains_with_the_action_bearing_reason(make_decider: MakeDecider) -> None:
    decider, slurm, store = make_decider(fleet(200))
    [d] = decider.decide([drain_request("n0001")])
    assert (d.done, d.changed, d.reason) == ("drained", True, "gpuforge:gpu.xid:reboot")
    assert slurm.nodes["n0001"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")
    [event] = store.events(kinds=["drain"])
    assert (event.node, event.check, event.action, event.source) == (
        "n0001",
        "gpu.xid",
        "reboot",
        "health",
    )


def test_no_request_calls_no_slurm(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(10))
    [d] = decider.decide([record("n0001")])
    assert d.done == "none"
    assert slurm.calls == []


def test_an_operator_drain_is_never_touched(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(200), drained={"n0001": OPERATOR})
    drain, resume = (
        decider.decide([drain_request("n0001")]),
        decider.decide([resume_request("n0001")]),
    )
    assert drain[0].done == "none" and OPERATOR in drain[0].detail
    assert resume[0].done == "none" and "someone else" in resume[0].detail
    assert slurm.nodes["n0001"] == ("IDLE+DRAIN", OPERATOR)
    assert slurm.updates() == []


def test_an_error_never_drains(make_decider: MakeDecider) -> None:
    decider, slurm, store = make_decider(fleet(200))
    rec = record("n0001", verdict="error", failed=(("gpu.xid", "reboot"),), status="error")
    rec["request"] = {"op": "drain", "check": "gpu.xid", "action": "reboot", "more": 0}
    [d] = decider.decide([rec])
    assert d.done == "held" and "only a FAIL drains" in d.detail
    assert slurm.updates() == []
    assert [e.kind for e in store.events()] == ["hold"]


def test_monitor_does_not_take_a_node_out(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(200))
    [d] = decider.decide([drain_request("n0001", "gpu.xid", "monitor")])
    assert d.done == "none"
    assert slurm.updates() == []


def test_the_breaker_refuses_the_drain_beyond_the_fleet_share(make_decider: MakeDecider) -> None:
    decider, slurm, store = make_decider(fleet(200), DecisionPolicy(max_fraction=0.01))
    done = [decider.decide([drain_request(f"n{i:04d}")])[0].done for i in range(3)]
    assert done == ["drained", "drained", "refused"]  # 1% of 200 = 2
    assert slurm.nodes["n0002"] == ("IDLE", "")
    [refused] = store.events(kinds=["refused"])
    assert refused.node == "n0002" and "circuit breaker" in refused.detail
    assert [a.node for a in decider.admission.refused()] == ["n0002"]


def test_the_breaker_holds_one_node_per_leaf(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(1000, per_leaf=4), DecisionPolicy(max_per_leaf=1))
    [a, b, c] = decider.decide([drain_request(n) for n in ("n0000", "n0001", "n0004")])
    assert (a.done, b.done, c.done) == ("drained", "refused", "drained")
    assert "leaf-0000-r0" in b.detail
    assert slurm.nodes["n0001"] == ("IDLE", "")


def test_a_burst_of_50_concurrent_requests_never_races_the_breaker(
    make_decider: MakeDecider,
) -> None:
    decider, slurm, _ = make_decider(fleet(1000), DecisionPolicy(max_fraction=0.01))
    results: list[str] = []
    start = threading.Barrier(50)

    def one(i: int) -> None:
        start.wait()
        results.append(decider.decide([drain_request(f"n{i:04d}")])[0].done)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count("drained") == 10  # 1% of 1,000
    assert sorted(results).count("refused") == 40
    drained = [n for n, (state, _) in slurm.nodes.items() if "DRAIN" in state]
    assert len(drained) == 10


def test_a_batch_meets_the_breaker_node_by_node(make_decider: MakeDecider) -> None:
    decider, _, _ = make_decider(fleet(1000), DecisionPolicy(max_fraction=0.01))
    done = [d.done for d in decider.decide([drain_request(f"n{i:04d}") for i in range(12)])]
    assert done.count("drained") == 10 and done[-2:] == ["refused", "refused"]


def test_resume_lifts_only_a_passing_health_drain_for_a_self_clearing_action(
    make_decider: MakeDecider,
) -> None:
    drained = {
        "n0001": "gpuforge:fabric.counters:quarantine",
        "n0002": "gpuforge:join:validate",
        "n0003": "gpuforge:gpu.xid:reboot",
        "n0004": "gpuforge:upgrade:quarantine",
        "n0005": OPERATOR,
    }
    decider, slurm, store = make_decider(fleet(200), drained=drained)
    decisions = decider.decide(
        [
            resume_request("n0001", "fabric.counters"),
            resume_request("n0002", "fabric.counters"),
            resume_request("n0003", "gpu.xid"),
            resume_request("n0004", "fabric.counters"),
            resume_request("n0005", "fabric.counters"),
            resume_request("n0006", "fabric.counters"),
        ]
    )
    assert [d.done for d in decisions] == ["resumed", "none", "none", "none", "none", "none"]
    assert "gpuforge remediate" in decisions[2].detail
    assert "not drained" in decisions[5].detail
    assert slurm.nodes["n0001"] == ("IDLE", "")
    for node, reason in drained.items():
        if node != "n0001":
            assert slurm.nodes[node] == ("IDLE+DRAIN", reason)
    assert [e.node for e in store.events(kinds=["resume"])] == ["n0001"]


def test_resume_of_a_drain_for_a_check_this_record_does_not_pass(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(
        fleet(200), drained={"n0001": "gpuforge:fabric.flaps:quarantine"}
    )
    [d] = decider.decide([resume_request("n0001", "fabric.counters")])
    assert d.done == "none" and "does not report passing" in d.detail
    assert slurm.updates() == []


def test_shadow_mode_decides_and_changes_nothing(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(200), DecisionPolicy(shadow=True))
    [d] = decider.decide([drain_request("n0001")])
    assert d.done == "shadow" and d.reason == "gpuforge:gpu.xid:reboot"
    assert slurm.updates() == []


def test_the_callers_admission_keeps_its_source_and_breaker(make_decider: MakeDecider) -> None:
    decider, _, _ = make_decider(fleet(10))
    assert decider.admission.source == "health"
    assert decider.admission.breaker is not None
    theirs = Admission(decider.admission.slurm, decider.admission.record, source="conformance")
    Decider(theirs, leaves=fleet(10))
    assert (theirs.source, theirs.breaker) == ("conformance", None)


def test_the_last_record_of_a_node_in_a_batch_is_acted_on(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(
        fleet(200), drained={"n0001": "gpuforge:fabric.counters:quarantine"}
    )
    first, second = decider.decide(
        [resume_request("n0001", "fabric.counters"), drain_request("n0001", "gpu.xid", "reboot")]
    )
    assert first.done == "none" and "superseded" in first.detail
    assert second.done == "drained"
    assert slurm.nodes["n0001"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")


def _upgrade_admission(decider: Decider, now: float) -> Admission:
    """The admission a rolling upgrade uses: same record and Slurm, source ``upgrade``."""
    return replace(decider.admission, source="upgrade", breaker=None, clock=lambda: now)


def _quarantine(node: str) -> NodeVerdict:
    result = CheckResult(node, "upgrade", Status.FAIL, action="validate")
    return NodeVerdict(node, Verdict.QUARANTINE, ("upgrade",), (), (result,))


def test_an_upgrades_drains_do_not_use_up_the_breaker(make_decider: MakeDecider) -> None:
    decider, slurm, _ = make_decider(fleet(1000, per_leaf=4), DecisionPolicy(max_per_leaf=1))
    upgrade = _upgrade_admission(decider, T0 - 60)
    upgrade.admit([_quarantine("n0000"), _quarantine("n0001")], actions={"n0000": "validate"})
    assert slurm.nodes["n0001"][0] == "IDLE+DRAIN"
    # The leaf's breaker (1 node) is still whole for a fault: the upgrade's wave has its own limits.
    [d] = decider.decide([drain_request("n0002", action="reboot")])
    assert d.done == "drained", d.detail
    [refused] = decider.decide([drain_request("n0003", action="reboot")])
    assert refused.done == "refused"


def test_a_drain_from_before_the_nodes_last_resume_is_superseded(
    make_decider: MakeDecider,
) -> None:
    decider, slurm, _ = make_decider(fleet(200))
    upgrade = _upgrade_admission(decider, T0)
    upgrade.admit([_quarantine("n0001")])
    upgrade.admit([NodeVerdict("n0001", Verdict.ADMIT)])  # validated and resumed at T0
    assert slurm.nodes["n0001"] == ("IDLE", "")
    # A record the node spooled while it was being upgraded, sent after the resume.
    late = drain_request("n0001", check="software.versions", action="quarantine")
    late["started"] = record("n0001", at=T0 - 120)["started"]
    [d] = decider.decide([late])
    assert (d.done, d.changed) == ("none", False)
    assert "superseded" in d.detail and "upgrade" in d.detail
    assert slurm.nodes["n0001"] == ("IDLE", "")
    # A record taken after the resume still drains.
    fresh = drain_request("n0001", check="software.versions", action="quarantine")
    fresh["started"] = record("n0001", at=T0 + 30)["started"]
    [d] = decider.decide([fresh])
    assert d.done == "drained"
