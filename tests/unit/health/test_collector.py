"""The collector over real HTTP: records stored, requests decided, forged sources refused."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.health.collector import (
    MAX_BODY,
    Collector,
    _Batcher,
    make_server,
    parse_listen,
)
from gpuforge.health.decide import DecisionPolicy
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import iso
from gpuforge.node.output import SENT_HEADER
from gpuforge.validate.result import NodeVerdict, Verdict

from ..history.records import T0, record
from ..slurm.fake import FakeSlurm
from .conftest import MakeDecider
from .test_decide import _quarantine, drain_request

LOCAL = "127.0.0.1"


@pytest.fixture
def served(make_decider: MakeDecider, tmp_path: Path) -> Iterator[tuple[str, Collector, FakeSlurm]]:
    leaves = {"gpu01": "leaf-a", "gpu02": "leaf-b", "gpu03": "leaf-c"}
    decider, slurm, store = make_decider(leaves, DecisionPolicy(max_fraction=1.0))
    fleet = Fleet(
        "lab",
        ("gpu01", "gpu02", "gpu03"),
        {"gpu01": LOCAL, "gpu02": "10.231.0.12", "gpu03": LOCAL},
        leaves,
        {},
    )
    collector = Collector(fleet, store, decider, metrics_dir=tmp_path / "textfile",
                          clock=lambda: T0)  # fmt: skip
    with serving(collector) as url:
        yield url, collector, slurm


@contextmanager
def serving(collector: Collector) -> Iterator[str]:
    """``collector`` started and served on a free port of 127.0.0.1: its URL."""
    collector.start()
    server = make_server(collector, LOCAL, 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://{LOCAL}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        collector.stop()


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def post(url: str, body: bytes, sent: float | None = None) -> tuple[int, Any]:
    """POST a record; ``sent``: the node's clock as it sends it (its X-Gpuforge-Sent header)."""
    headers = {SENT_HEADER: f"{sent:.3f}"} if sent is not None else {}
    return request(url, "POST", "/v1/records", body, headers)


def test_a_record_is_stored_and_answered(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, collector, slurm = served
    status, body = post(url, json.dumps(record("gpu01")).encode())
    assert status == 200
    assert body["decision"]["done"] == "none"
    assert collector.store.latest()["gpu01"].verdict == "pass"
    assert slurm.calls == []  # no request, no Slurm


def test_a_drain_request_drains_through_http(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, _, slurm = served
    status, body = post(url, json.dumps(drain_request("gpu01")).encode())
    assert status == 200
    assert body["decision"]["done"] == "drained"
    assert body["decision"]["reason"] == "gpuforge:gpu.xid:reboot"
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")


def test_a_late_spooled_request_is_stored_but_not_acted_on(
    served: tuple[str, Collector, FakeSlurm],
) -> None:
    # Seen on the d2health lab: after the collector was away, a node that had rebooted and was
    # healthy again sent its spooled records, and their old drain requests drained it again.
    url, collector, slurm = served
    stale = record(
        "gpu01",
        at=T0 - 3600,
        verdict="fail",
        failed=(("gpu.xid", "reboot"),),
        request={"op": "drain", "check": "gpu.xid", "action": "reboot", "more": 0},
    )
    status, body = post(url, json.dumps(stale).encode())
    assert status == 200
    assert body["decision"]["done"] == "none"
    assert "stale request" in body["decision"]["detail"]
    assert slurm.nodes["gpu01"] == ("IDLE", "")
    assert collector.store.node_history("gpu01")  # kept in the history all the same


def _failing(at: float) -> bytes:
    """A FAIL record of gpu01 started at ``at`` (the node's clock) asking to drain it."""
    return json.dumps(drain_request("gpu01") | {"started": iso(at)}).encode()


#: A node's clock against the collector's (at T0): 20 minutes behind, or 4 minutes ahead
#: (inside the 300 s a record may be dated ahead).
SKEWS = pytest.mark.parametrize("offset", [-1200.0, 240.0], ids=["behind-20min", "ahead-4min"])


@SKEWS
def test_a_fresh_request_acts_whatever_the_nodes_clock(
    served: tuple[str, Collector, FakeSlurm], offset: float
) -> None:
    """Its age is its own (its start to its sending, both on the node's clock), not the node's
    clock against the collector's: a node 20 minutes behind is drained on a fresh FAIL."""
    url, collector, slurm = served
    node_now = T0 + offset
    status, body = post(url, _failing(node_now - 2), sent=node_now)
    assert status == 200
    assert body["decision"]["done"] == "drained", body["decision"]
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")
    # Not stale in fleet status either: the collector received it now.
    text = collector.write_metrics(read_slurm=False)
    assert text is not None and "gpuforge_fleet_stale_nodes 2" in text.read_text()  # 02, 03


@SKEWS
def test_an_old_spooled_request_sent_now_is_not_acted_on(
    served: tuple[str, Collector, FakeSlurm], offset: float
) -> None:
    """The node's spool after the collector was away: received now, taken 700 s before it was
    sent. On a node 4 minutes ahead, its date against the collector's clock says 460 s (inside
    600); on one 20 minutes behind, 1,900 s. Either way the record's own age, 700 s, decides."""
    url, collector, slurm = served
    node_now = T0 + offset
    status, body = post(url, _failing(node_now - 700), sent=node_now)
    assert status == 200
    assert body["decision"]["done"] == "none"
    assert "stale request: the record is 700s old" in body["decision"]["detail"]
    assert "on the node's clock" in body["decision"]["detail"]
    assert slurm.nodes["gpu01"] == ("IDLE", "")
    assert collector.store.latest()["gpu01"].verdict == "fail"  # stored all the same


def test_a_send_time_that_is_not_a_number_is_ignored(
    served: tuple[str, Collector, FakeSlurm],
) -> None:
    """Then, as for a node checker that sends none, the record's start against the collector's
    clock: an hour old is stale."""
    url, _, slurm = served
    for sent in ("soon", "nan", "inf", "1" * 40):
        status, body = request(url, "POST", "/v1/records", _failing(T0 - 3600),
                               {SENT_HEADER: sent})  # fmt: skip
        assert status == 200
        assert "it named no send time" in body["decision"]["detail"], sent
    assert slurm.nodes["gpu01"] == ("IDLE", "")


def test_a_resume_before_a_fresh_record_of_a_node_behind_does_not_supersede_it(
    served: tuple[str, Collector, FakeSlurm],
) -> None:
    """A node 20 minutes behind, resumed by an upgrade 5 minutes ago: a record it took before
    the resume is superseded, its fresh FAIL (taken after the resume on the collector's clock,
    though its started says 20 minutes before) drains it."""
    url, collector, slurm = served
    upgrade = replace(collector.decider.admission, source="upgrade", breaker=None,
                      clock=lambda: T0 - 300)  # fmt: skip
    upgrade.admit([_quarantine("gpu01")])
    upgrade.admit([NodeVerdict("gpu01", Verdict.ADMIT)])
    assert slurm.nodes["gpu01"] == ("IDLE", "")
    node_now = T0 - 1200
    status, body = post(url, _failing(node_now - 400), sent=node_now)  # taken at T0 - 400
    assert (status, body["decision"]["done"]) == (200, "none"), body["decision"]
    assert "superseded" in body["decision"]["detail"]
    status, body = post(url, _failing(node_now - 2), sent=node_now)  # taken at T0 - 2
    assert (status, body["decision"]["done"]) == (200, "drained"), body["decision"]
    assert slurm.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.xid:reboot")


def test_a_forged_source_address_is_refused(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, collector, slurm = served
    status, body = post(url, json.dumps(drain_request("gpu02")).encode())  # gpu02 is 10.231.0.12
    assert status == 403
    assert "management address" in body["error"]
    assert slurm.nodes["gpu02"] == ("IDLE", "")
    assert collector.store.latest() == {}


def test_the_address_check_reads_ipv4_mapped_peers(
    served: tuple[str, Collector, FakeSlurm],
) -> None:
    _, collector, _ = served
    ok = collector.receive(json.dumps(record("gpu01")).encode(), "::ffff:127.0.0.1")
    forged = collector.receive(json.dumps(record("gpu02")).encode(), "::ffff:127.0.0.1")
    assert (ok.status, forged.status) == (200, 403)


def test_an_unknown_node_is_refused(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, _, _ = served
    status, body = post(url, json.dumps(record("gpu99")).encode())
    assert status == 403 and "not a GPU node" in body["error"]


def test_a_bad_record_names_the_field(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, collector, _ = served
    bad = record("gpu01")
    bad["verdict"] = "green"
    status, body = post(url, json.dumps(bad).encode())
    assert status == 400 and "verdict" in body["error"]
    status, body = post(url, b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]
    assert collector.store.latest() == {}


def test_a_body_over_the_limit_is_refused_unread(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, _, _ = served
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection((LOCAL, port), timeout=10) as conn:
        head = f"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n"
        conn.sendall(head.encode())  # the body is never sent: the answer must not wait for it
        answer = conn.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413")


def test_healthz(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, _, _ = served
    status, body = request(url, "GET", "/v1/healthz")
    assert status == 200
    assert body["status"] == "ok" and body["nodes"] == 3


def test_metrics_textfile_says_what_the_fleet_is(served: tuple[str, Collector, FakeSlurm]) -> None:
    url, collector, slurm = served
    post(url, json.dumps(drain_request("gpu01")).encode())
    post(url, json.dumps(record("gpu03", at=T0)).encode())
    slurm.nodes["gpu03"] = ("IDLE+DRAIN", "rack maintenance")
    path = collector.write_metrics()
    assert path is not None
    text = path.read_text()
    assert 'gpuforge_fleet_nodes{verdict="fail"} 1' in text
    assert 'gpuforge_fleet_nodes{verdict="none"} 1' in text
    assert 'gpuforge_fleet_drained_nodes{by="gpuforge"} 1' in text
    assert 'gpuforge_fleet_drained_nodes{by="operator"} 1' in text
    assert "gpuforge_fleet_stale_nodes 1" in text
    assert "gpuforge_health_breaker_open 0" in text


def test_a_refusal_opens_the_breaker_metric(make_decider: MakeDecider, tmp_path: Path) -> None:
    leaves = {"gpu01": "leaf-a", "gpu02": "leaf-a"}
    decider, _, store = make_decider(leaves, DecisionPolicy(max_fraction=0.5))
    fleet = Fleet("lab", ("gpu01", "gpu02"), {"gpu01": LOCAL, "gpu02": LOCAL}, leaves, {})
    collector = Collector(fleet, store, decider, metrics_dir=tmp_path, clock=lambda: T0)
    collector.start()
    try:
        answers = [collector.receive(json.dumps(drain_request(n)).encode(), LOCAL)
                   for n in ("gpu01", "gpu02")]  # fmt: skip
    finally:
        collector.stop()
    assert [a.body["decision"]["done"] for a in answers] == ["drained", "refused"]
    text = (tmp_path / "gpuforge_controller.prom").read_text()
    assert "gpuforge_health_breaker_open 1" in text
    assert "gpuforge_health_refused_drains_total 1" in text


def test_parse_listen() -> None:
    assert parse_listen("10.231.0.1:9477") == ("10.231.0.1", 9477)
    assert parse_listen("10.231.0.1") == ("10.231.0.1", 9477)
    with pytest.raises(InputError, match="port"):
        parse_listen("10.231.0.1:http")


def test_a_burst_of_50_posts_drains_no_more_than_the_breaker(
    make_decider: MakeDecider, tmp_path: Path
) -> None:
    leaves = {f"n{i:04d}": f"leaf-{i:04d}" for i in range(1000)}
    decider, slurm, store = make_decider(leaves, DecisionPolicy(max_fraction=0.01))
    fleet = Fleet("big", tuple(leaves), dict.fromkeys(leaves, LOCAL), leaves, {})
    collector = Collector(fleet, store, decider, metrics_dir=tmp_path, clock=lambda: T0)
    collector.start()
    done: list[str] = []
    start = threading.Barrier(50)

    def one(i: int) -> None:
        start.wait()
        answer = collector.receive(json.dumps(drain_request(f"n{i:04d}")).encode(), LOCAL)
        done.append(answer.body["decision"]["done"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        collector.stop()
    assert (done.count("drained"), done.count("refused")) == (10, 40)
    assert sum("DRAIN" in state for state, _ in slurm.nodes.values()) == 10
    assert len(store.latest()) == 50


def test_an_unwritable_metrics_dir_does_not_fail_the_answer(
    make_decider: MakeDecider, tmp_path: Path
) -> None:
    leaves = {"gpu01": "leaf-a", "gpu02": "leaf-a"}
    decider, _, store = make_decider(leaves, DecisionPolicy(max_fraction=0.5))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    fleet = Fleet("lab", ("gpu01", "gpu02"), {"gpu01": LOCAL, "gpu02": LOCAL}, leaves, {})
    collector = Collector(fleet, store, decider, metrics_dir=blocker, clock=lambda: T0)
    collector.start()
    try:
        answers = [collector.receive(json.dumps(drain_request(n)).encode(), LOCAL)
                   for n in ("gpu01", "gpu02")]  # fmt: skip
    finally:
        collector.stop()
    assert [(a.status, a.body["decision"]["done"]) for a in answers] == [
        (200, "drained"),
        (200, "refused"),
    ]


def test_one_bad_item_does_not_fail_its_batch() -> None:
    def work(items: list[str]) -> list[str]:
        if "bad" in items:
            raise InputError("cannot store 'bad'")
        return [item.upper() for item in items]

    batcher: _Batcher[str, str] = _Batcher("test-writer", work, max_batch=10)
    futures = [batcher.submit(item) for item in ("a", "bad", "b")]  # queued: one batch
    batcher.start()
    try:
        assert futures[0].result(timeout=10) == "A"
        assert futures[2].result(timeout=10) == "B"
        with pytest.raises(InputError):
            futures[1].result(timeout=10)
    finally:
        batcher.stop()


def test_a_late_shutdown_after_close_is_harmless(make_decider: MakeDecider) -> None:
    # SIGTERM's shutdown thread can run after the loop ended and closed its trigger: it must not
    # write to the closed descriptor (a traceback on stderr, or a byte into a reused one).
    decider, _, store = make_decider({"gpu01": "leaf-a"})
    collector = Collector(Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, {}, {}), store, decider)
    server = make_server(collector, LOCAL, 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    server.shutdown()
    thread.join(10)
    server.server_close()
    trigger = server._server.trigger
    writes: list[bytes] = []
    trigger._physical_pull = lambda: writes.append(b"x")
    server.shutdown()  # returns at once, pulls nothing
    assert writes == []
    make_server(collector, LOCAL, 0).server_close()  # the history's lock was let go
