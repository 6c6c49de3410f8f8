"""The collector over real HTTP: records stored, requests decided, forged sources refused."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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

from ..history.records import T0, record
from ..slurm.fake import FakeSlurm
from .conftest import MakeDecider
from .test_decide import drain_request

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


def request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def post(url: str, body: bytes) -> tuple[int, Any]:
    return request(url, "POST", "/v1/records", body)


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
