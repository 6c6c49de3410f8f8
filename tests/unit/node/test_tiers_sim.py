"""Prolog, epilog, outputs and the collector round trip, against the lab simulator."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuforge.node import engine, output
from gpuforge.node.record import from_json
from tests.unit.node.simnode import SimNode

SLURM_COMMANDS = ("scontrol", "sinfo", "squeue", "srun", "sbatch", "sacct", "sacctmgr")


class Collector:
    """A local HTTP collector: records what it receives, answers a configurable decision."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.status = 200
        self.done = "none"
        #: Seconds the collector's clock is ahead of this machine's (None: an answer without it).
        self.clock_ahead: float | None = None
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.received.append({"path": self.path, "record": json.loads(body)})
                doc: dict[str, Any] = {"decision": {"done": collector.done}}
                if collector.clock_ahead is not None:
                    doc[output.CLOCK_KEY] = time.time() + collector.clock_ahead
                answer = json.dumps(doc).encode()
                self.send_response(collector.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                del args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()
    c.server.server_close()


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    n = SimNode(tmp_path)
    for tool in SLURM_COMMANDS:  # any call leaves a mark
        n._script(tool, f"#!/bin/sh\necho {tool} >> {tmp_path}/slurm-calls\n")
    return n


def _slurm_calls(node: SimNode) -> str:
    path = node.root / "slurm-calls"
    return path.read_text() if path.exists() else ""


def test_prolog_passes_on_a_clean_node_without_slurm_commands(node: SimNode) -> None:
    node.run("passive")
    out = node.run("prolog", job_id="4242")
    assert out.exit_code == 0
    assert out.record.verdict == "pass"
    assert out.record.job_id == "4242"
    assert _slurm_calls(node) == ""
    assert out.record.duration_s < 30


def test_prolog_blocks_on_a_new_hardware_xid_and_asks_for_the_drain(
    node: SimNode, collector: Collector
) -> None:
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.run("passive")
    node.set_faults([{"kind": "xid", "gpu": 2, "code": 79}])
    collector.received.clear()
    out = node.run("prolog")
    assert out.exit_code == 1
    xid = out.record.check("gpu.xid")
    assert xid is not None and (xid.status, xid.action) == ("fail", "reboot")
    assert out.record.request is not None
    assert out.record.request.to_dict() == {
        "op": "drain",
        "check": "gpu.xid",
        "action": "reboot",
        "more": 0,
    }
    assert [r["record"]["tier"] for r in collector.received] == ["prolog"]
    assert _slurm_calls(node) == ""


def test_prolog_never_blocks_for_a_shadowed_check(node: SimNode) -> None:
    node.extra["checks"] = {"gpu.xid": {"shadow": True}}
    node.set_faults([{"kind": "xid", "gpu": 2, "code": 79}])
    out = node.run("prolog")
    assert out.exit_code == 0
    assert out.record.check("gpu.xid").shadow is True  # type: ignore[union-attr]


@pytest.mark.parametrize(("done", "code"), [("drained", 1), ("refused", 0), ("held", 0)])
def test_prolog_blocks_on_a_cached_fail_only_once_the_collector_drained(
    node: SimNode, collector: Collector, done: str, code: int
) -> None:
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.only("fabric.port", "gpu.xid", "fabric.counters")
    node.set_faults([{"kind": "ib_port_down", "rail": 0}])
    collector.done = done
    node.run("passive")
    passive = node.run("passive")  # fabric.port: fail_after 2
    assert passive.record.request is not None and passive.record.request.op == "drain"
    decision = json.loads((node.root / "state/decision.json").read_text())
    assert decision == {"decision": {"done": done}}
    collector.received.clear()
    assert node.run("prolog").exit_code == code
    # Only a prolog that blocks the job tells the collector (the job start is waiting).
    assert len(collector.received) == code
    if done == "drained":
        # Rebooted (remediated) since that passive run: its cache no longer speaks for the node.
        node.set_boot("boot-2", uptime=30.0)
        assert node.run("prolog").exit_code == 0


def test_prolog_with_a_missing_kernel_log_is_error_and_lets_the_job_run(node: SimNode) -> None:
    node.remove_tool("dmesg")
    out = node.run("prolog")
    assert out.exit_code == 0
    assert out.record.check("gpu.xid").status == "error"  # type: ignore[union-attr]


def test_epilog_runs_dcgm_r1_and_records_the_job(node: SimNode) -> None:
    out = node.run("epilog", job_id="777")
    assert out.record.job_id == "777"
    dcgm = out.record.check("gpu.dcgm_diag")
    assert dcgm is not None and dcgm.status == "pass", dcgm.message
    assert out.exit_code == 0
    node.set_faults([{"kind": "ecc_uncorrectable", "gpu": 1}])
    bad = node.run("epilog", job_id="778")
    assert bad.record.check("gpu.ecc_uncorrectable").status == "fail"  # type: ignore[union-attr]
    assert bad.exit_code == 0  # the collector drains, behind its breaker
    assert bad.record.request is not None and bad.record.request.check is not None


def test_job_id_from_env() -> None:
    assert engine.job_id_from_env({"SLURM_JOB_ID": "12"}) == "12"
    assert engine.job_id_from_env({}) is None


def test_outputs_metrics_last_record_and_delivery(node: SimNode, collector: Collector) -> None:
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.set_faults([{"kind": "xid", "gpu": 4, "code": 79}])
    collector.done = "drained"
    out = node.run("passive")
    assert collector.received[0]["path"] == "/v1/records"
    sent = from_json(json.dumps(collector.received[0]["record"]))
    assert sent == out.record
    last = from_json((node.root / "state/last-passive.json").read_text())
    assert last == out.record
    assert output.spooled(node.config()) == []
    prom = (node.root / "textfile/gpuforge_passive.prom").read_text()
    assert 'gpuforge_health_check_status{tier="passive",check="gpu.xid"} 2' in prom
    assert 'gpuforge_health_verdict{tier="passive"} 2' in prom
    assert 'gpuforge_health_drain_requested{check="gpu.xid",action="reboot"} 1' in prom
    assert 'gpuforge_health_check_shadow{check="fabric.roce_pfc"} 1' in prom
    assert 'gpuforge_health_run_duration_seconds{tier="passive"}' in prom
    assert 'gpuforge_health_last_run_timestamp_seconds{tier="passive"}' in prom
    assert "gpuforge_health_spool_dropped_total 0" in prom


def test_a_collector_that_is_down_never_fails_the_check_and_the_spool_is_bounded(
    node: SimNode, collector: Collector
) -> None:
    collector.server.shutdown()
    collector.server.server_close()
    node.extra["collector"] = {"url": collector.url, "timeout_s": 1}
    node.extra["spool_max"] = 2
    node.only("fabric.mtu")
    for _ in range(3):
        out = node.run("passive")
        assert out.record.verdict == "pass"
        assert out.delivery is not None and out.delivery.error
    config = node.config()
    assert len(output.spooled(config)) == 2
    prom = (node.root / "textfile/gpuforge_passive.prom").read_text()
    assert "gpuforge_health_spool_dropped_total 1" in prom
    assert "gpuforge_health_spool_records 2" in prom


@pytest.mark.parametrize(
    ("done", "code", "expected"),
    [
        ("drained", 79, 1),  # the collector drained (gpuforge reason, its breaker counted it)
        ("refused", 79, 0),  # its circuit breaker said no: the prolog must not undo it
        ("held", 79, 0),
        ("shadow", 48, 0),
        ("drained", 48, 1),
        ("none", 79, 1),  # an answer that decided nothing: the fatal class still blocks
        ("none", 48, 0),  # ... and a reset_gpu Xid lets the job run
    ],
)
def test_prolog_blocks_a_new_xid_only_with_the_collectors_consent(
    node: SimNode, collector: Collector, done: str, code: int, expected: int
) -> None:
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.run("passive")
    node.set_faults([{"kind": "xid", "gpu": 2, "code": code}])
    collector.done = done
    collector.received.clear()
    out = node.run("prolog")
    assert out.exit_code == expected
    assert out.record.request is not None and out.record.request.op == "drain"
    assert [r["record"]["tier"] for r in collector.received][-1:] == ["prolog"]


@pytest.mark.parametrize(("code", "expected"), [(79, 1), (48, 0)])
def test_prolog_without_a_collector_blocks_only_for_a_fatal_xid(
    node: SimNode, code: int, expected: int
) -> None:
    node.extra["collector"] = {"url": "http://127.0.0.1:9", "timeout_s": 0.5}  # refused
    node.run("passive")
    node.set_faults([{"kind": "xid", "gpu": 2, "code": code}])
    out = node.run("prolog")
    assert out.exit_code == expected
    assert out.delivery is not None and out.delivery.error


def test_node_clock_judges_the_offset_the_last_answer_measured(
    node: SimNode, collector: Collector
) -> None:
    """No chrony asked: the collector's clock in its answer, kept in state.json for the next run."""
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.only("node.clock")
    collector.clock_ahead = 120.0  # the node is two minutes behind the collector
    first = node.run("passive").record.check("node.clock")
    assert first is not None and first.status == "skip"  # nothing measured yet: never an ERROR
    assert "not measured yet" in first.message
    second = node.run("passive")
    clock = second.record.check("node.clock")
    assert clock is not None and (clock.status, clock.action) == ("warn", "monitor")
    assert clock.measured == pytest.approx(120.0, abs=2)
    assert "behind the collector's" in clock.message and "round trip" in clock.evidence
    assert (second.record.verdict, second.record.request) == ("warn", None)  # never a drain
    saved = json.loads((node.root / "state/state.json").read_text())["clock"]
    assert saved["offset_s"] == pytest.approx(120.0, abs=2) and saved["rtt_s"] < 2
    collector.clock_ahead = -0.5  # fixed: the next run still judges the last measurement
    assert node.run("passive").record.check("node.clock").status == "warn"  # type: ignore[union-attr]
    fixed = node.run("passive").record.check("node.clock")
    assert fixed is not None and fixed.status == "pass"
    assert fixed.measured == pytest.approx(-0.5, abs=2)


def test_node_clock_skips_without_a_measurement_or_with_an_old_one(
    node: SimNode, collector: Collector
) -> None:
    node.only("node.clock")
    alone = node.run("passive").record.check("node.clock")  # no collector configured
    assert alone is not None and (alone.status, alone.message) == (
        "skip", "no collector configured: no clock to compare with"
    )  # fmt: skip
    node.extra["collector"] = {"url": collector.url, "timeout_s": 2}
    node.run("passive")  # an older collector: its answers carry no clock
    assert node.run("passive").record.check("node.clock").status == "skip"  # type: ignore[union-attr]
    collector.clock_ahead = 1000.0
    node.run("passive")
    node.extra["checks"]["node.clock"] = {"max_age_s": 1}
    time.sleep(1.5)
    old = node.run("passive").record.check("node.clock")
    assert old is not None and old.status == "skip" and "old (max_age_s 1)" in old.message
