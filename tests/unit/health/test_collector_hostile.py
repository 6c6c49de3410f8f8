"""The collector against hostile and careless clients (issue 33 items 2-4, 7; issue 28 item 3).

Every malformed request gets a status and one log line; a client that goes away is one line;
no log ever holds a traceback, and the collector keeps serving. The malformed requests are
written on raw sockets to 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuforge import database
from gpuforge.health import intake
from gpuforge.health.collector import MAX_BODY, Collector, make_server
from gpuforge.health.decide import DecisionPolicy
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import SCHEMA, HistoryStore, iso

from ..history.records import T0, record
from .conftest import MakeDecider
from .test_collector import LOCAL, post, request, serving

Served = tuple[str, int, Collector]


@pytest.fixture
def served(
    make_decider: MakeDecider, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[Served]:
    caplog.set_level(logging.INFO)
    leaves = {"gpu01": "leaf-a", "gpu02": "leaf-b"}
    decider, _, store = make_decider(leaves, DecisionPolicy(max_fraction=1.0))
    fleet = Fleet("lab", ("gpu01", "gpu02"), {"gpu01": LOCAL, "gpu02": "10.231.0.12"}, leaves, {})
    collector = Collector(fleet, store, decider, metrics_dir=tmp_path / "textfile",
                          clock=lambda: T0)  # fmt: skip
    with serving(collector) as url:
        yield url, int(url.rsplit(":", 1)[1]), collector
    assert_no_traceback(caplog)


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.stack_info]
    assert "Traceback" not in caplog.text


def raw(port: int, data: bytes, *, timeout: float = 10) -> bytes:
    """Send ``data`` on a fresh connection; everything the collector answers until it closes."""
    with socket.create_connection((LOCAL, port), timeout=timeout) as conn:
        conn.sendall(data)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def slow_ingest(
    monkeypatch: pytest.MonkeyPatch, store: HistoryStore, delay_s: float
) -> tuple[threading.Event, threading.Event]:
    """``store.ingest`` made ``delay_s`` slower: (a batch entered it, a batch was stored)."""
    ingest = store.ingest
    entered, stored = threading.Event(), threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        time.sleep(delay_s)
        try:
            return ingest(*args, **kwargs)
        finally:
            stored.set()

    monkeypatch.setattr(store, "ingest", slow)
    return entered, stored


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> Any:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def post_raw(port: int, body: bytes, *, length: str | None = None) -> bytes:
    head = "POST /v1/records HTTP/1.1\r\nHost: c\r\nConnection: close\r\n"
    head += f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    return raw(port, head.encode("latin-1") + body)


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def still_serving(url: str) -> None:
    status, body = request(url, "GET", "/v1/healthz")
    assert status == 200 and body["status"] == "ok"


GOOD = json.dumps(record("gpu01")).encode()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"\xef\xbb\xbf" + GOOD, "UTF-8 with a byte order mark"),
        (GOOD.decode().encode("utf-16"), "UTF-16 (little-endian, with a byte order mark)"),
        (GOOD.decode().encode("utf-16-be"), "UTF-16 (big-endian)"),
        (GOOD.decode().encode("utf-16-le"), "UTF-16 (little-endian)"),
        (GOOD.decode().encode("utf-32"), "UTF-32 (little-endian, with a byte order mark)"),
        (GOOD.decode().encode("utf-32-be"), "UTF-32 (big-endian)"),
        (GOOD.replace(b'"gpu01"', b'"gpu\xe901"'), "not UTF-8 (byte 0xe9"),
    ],
    ids=["utf8-bom", "utf16-bom", "utf16be", "utf16le", "utf32-bom", "utf32be", "latin1"],
)
def test_a_body_that_is_not_bomless_utf8_is_refused_naming_its_encoding(
    served: Served, caplog: pytest.LogCaptureFixture, body: bytes, named: str
) -> None:
    url, port, collector = served
    answer = post_raw(port, body)
    assert status_of(answer) == 400
    assert named in body_of(answer)["error"]
    assert collector.store.latest() == {}  # nothing stored that a reader would choke on
    assert len([m for m in lines(caplog) if named in m]) == 1
    still_serving(url)


def test_200000_brackets_are_refused_not_a_recursion_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    url, port, _ = served
    answer = post_raw(port, b"[" * 200_000)
    assert status_of(answer) == 400
    assert "nested deeper" in body_of(answer)["error"]
    deep = b'{"a":' * 40 + b"1" + b"}" * 40  # parses, but deeper than a record is
    assert status_of(post_raw(port, deep)) == 400
    assert len(lines(caplog)) == 2
    still_serving(url)


@pytest.mark.parametrize(
    ("token", "where"),
    [("NaN", "duration_s"), ("Infinity", "duration_s"), ("-Infinity", "duration_s"),
     ("1e400", "duration_s"), ("9" * 4000, "duration_s")],
)  # fmt: skip
def test_a_number_the_store_cannot_hold_in_a_required_field_is_refused(
    served: Served, token: str, where: str
) -> None:
    url, port, collector = served
    body = GOOD.replace(b'"duration_s": 1.8', b'"duration_s": ' + token.encode())
    assert body != GOOD
    answer = post_raw(port, body)
    assert status_of(answer) == 400
    assert where in body_of(answer)["error"]
    assert collector.store.latest() == {}
    still_serving(url)


def test_a_field_the_store_cannot_hold_is_refused_and_named_the_record_kept(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    url, port, collector = served
    rec = record("gpu01", events=[{"time": iso(T0), "gpu": 1, "event": "xid", "code": 79}])
    text = json.dumps(rec)
    text = text.replace('"code": 79', '"code": ' + str(2**70))  # beyond SQLite's INTEGER
    text = text.replace(
        '"ib/mlx5_0/1/symbol_error": 0', '"ib/mlx5_0/1/symbol_error": ' + "7" * 4000
    )
    text = text.replace('"measured": 8', '"measured": NaN').replace(
        '"expected": 8', '"expected": Infinity'
    )
    answer = post_raw(port, text.encode())
    assert status_of(answer) == 200
    refused = body_of(answer)["refused"]
    assert any(r.startswith("events[0].code: 1180591620717411303424 is beyond") for r in refused)
    assert any(
        r.startswith("counters.ib/mlx5_0/1/symbol_error: an integer of 4000") for r in refused
    )
    assert any(r.startswith("checks[0].measured: NaN is not a JSON number") for r in refused)
    assert any(r.startswith("checks[0].expected: Infinity") for r in refused)
    latest = collector.store.latest()["gpu01"]
    assert latest.verdict == "pass"
    with collector.store.transaction() as db:
        events = db.execute("SELECT kind, code FROM events WHERE node = 'gpu01'").fetchall()
    assert events == [("xid", None)]
    assert len([m for m in lines(caplog) if "stored without" in m]) == 1
    still_serving(url)


def test_an_event_without_a_time_is_stored_at_the_records_time(served: Served) -> None:
    # The record schema allows "time": null; the whole record must not be refused for it.
    url, port, collector = served
    rec = record(
        "gpu01",
        at=T0 - 60,
        events=[
            {"time": None, "gpu": 1, "event": "xid", "code": 79},
            {"gpu": 2, "event": "xid", "code": 48},
            {"time": None, "gpu": 3, "event": "xid", "code": 13},
        ],
    )
    text = json.dumps(rec).replace('"code": 13', '"code": ' + str(2**70))
    answer = post_raw(port, text.encode())
    assert status_of(answer) == 200
    assert any(r.startswith("events[2].code: ") for r in body_of(answer)["refused"])
    assert collector.store.latest()["gpu01"].verdict == "pass"
    with collector.store.read() as db:
        events = db.execute(
            "SELECT at, gpu, code FROM events WHERE node = 'gpu01' ORDER BY gpu"
        ).fetchall()
    assert events == [(T0 - 60, 1, 79), (T0 - 60, 2, 48), (T0 - 60, 3, None)]
    # Sent again (a spooled copy): each event is still stored once.
    assert status_of(post_raw(port, text.encode())) == 200
    with collector.store.read() as db:
        assert db.execute("SELECT count(*) FROM events WHERE node = 'gpu01'").fetchone() == (3,)
    still_serving(url)


@pytest.mark.parametrize(
    "bad",
    ["yesterday", "2026-13-01T00:00:00Z", "9999-12-31T23:59:59-14:00", 1795000000, True],
    ids=["a-word", "month-13", "beyond-year-9999", "a-number", "a-bool"],
)
def test_a_time_the_collector_cannot_read_is_refused_alone(
    served: Served, caplog: pytest.LogCaptureFixture, tmp_path: Path, bad: object
) -> None:
    """Item 4: the record is stored with the field refused and named, never dropped whole."""
    url, port, collector = served
    rec = record("gpu01", at=T0 - 60, verdict="fail", failed=(("gpu.xid", "reboot"),),
                 events=[{"time": iso(T0 - 90), "gpu": 1, "event": "xid", "code": 79},
                         {"time": bad, "gpu": 2, "event": "xid", "code": 48}])  # fmt: skip
    answer = post_raw(port, json.dumps(rec).encode())
    assert status_of(answer) == 200
    assert body_of(answer)["refused"] == [
        f"events[1].time: {bad!r} is not an ISO 8601 time: set to null"
    ]
    with collector.store.read() as db:
        events = db.execute(
            "SELECT at, gpu, code FROM events WHERE kind = 'xid' ORDER BY gpu"
        ).fetchall()
    assert events == [(T0 - 90, 1, 79), (T0 - 60, 2, 48)]  # kept, at its record's time
    assert collector.store.latest()["gpu01"].verdict == "fail"
    # The record's own time: the collector's receive time takes its place, named.
    rec = record("gpu01", at=T0, verdict="pass")
    rec["started"] = bad
    answer = post_raw(port, json.dumps(rec).encode())
    assert status_of(answer) == 200
    assert body_of(answer)["refused"] == [
        f"started: {bad!r} is not an ISO 8601 time: the collector's receive time {iso(T0)} used"
    ]
    latest = collector.store.latest()["gpu01"]
    assert (latest.verdict, latest.at) == ("pass", T0)
    assert latest.record["started"] == iso(T0)
    assert collector.healthz()["fields_refused"] == 2
    assert collector.healthz()["records_trimmed"] == 2
    collector.write_metrics(read_slurm=False)
    text = (tmp_path / "textfile" / "gpuforge_controller.prom").read_text()
    assert "gpuforge_collector_refused_fields_total 2" in text
    assert len([m for m in lines(caplog) if "stored without" in m]) == 2
    still_serving(url)


def test_every_answer_carries_the_collectors_clock(served: Served) -> None:
    """The node checker's node.clock measures against it: a 2xx, a 4xx and a 422 alike."""
    url, port, _ = served
    status, body = post(url, GOOD)
    assert (status, body["collector_time"]) == (200, T0)
    status, body = post(url, json.dumps(record("gpu01", at=T0 + 3600)).encode())
    assert (status, body["collector_time"]) == (422, T0)
    answer = post_raw(port, b'{"schema": "gpuforge.record/1"}')
    assert (status_of(answer), body_of(answer)["collector_time"]) == (400, T0)


def test_a_record_dated_in_the_past_changes_the_verdict_and_records_the_failure(
    served: Served,
) -> None:
    """Item 2: the order is the collector's; a node whose clock went back a day is not frozen."""
    url, _, collector = served
    assert post(url, json.dumps(record("gpu01", at=T0)).encode())[0] == 200
    back = T0 - 86400
    assert post(url, json.dumps(record("gpu01", at=back)).encode())[0] == 200
    failing = record("gpu01", at=back + 60, verdict="fail", failed=(("gpu.xid", "reboot"),))
    assert post(url, json.dumps(failing).encode())[0] == 200
    latest = collector.store.latest()["gpu01"]
    assert (latest.verdict, latest.at, latest.received) == ("fail", back + 60, T0)
    assert [e.check for e in collector.store.events(kinds=["failure"])] == ["gpu.xid"]


@pytest.mark.parametrize(
    "length",
    ["\uff11\uff12", "\u0661\u0662", "1" * 5000, "-5", "12 34", "0x10", "1e3"],
    ids=["fullwidth", "arabic-indic", "5000-digits", "negative", "space", "hex", "exponent"],
)
def test_a_bad_content_length_is_answered_400(
    served: Served, caplog: pytest.LogCaptureFixture, length: str
) -> None:
    url, port, _ = served
    head = f"POST /v1/records HTTP/1.1\r\nHost: c\r\nContent-Length: {length}\r\n\r\n"
    answer = raw(port, head.encode("utf-8") + GOOD)
    assert status_of(answer) == 400
    assert "Content-Length" in body_of(answer)["error"]
    assert len(lines(caplog)) == 1
    still_serving(url)


def test_no_content_length_is_411_and_too_long_a_one_413(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    url, port, collector = served
    answer = raw(port, b"POST /v1/records HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 411
    answer = post_raw(port, b"", length=str(MAX_BODY + 1))  # answered without the body
    assert status_of(answer) == 413
    assert status_of(raw(port, b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n")) == 431
    assert status_of(raw(port, b"PUT /v1/records HTTP/1.1\r\nConnection: close\r\n\r\n")) == 405
    assert status_of(raw(port, b"GET /etc/passwd HTTP/1.1\r\nConnection: close\r\n\r\n")) == 404
    assert status_of(raw(port, b"BREW /v1/records HTCPCP/1.0\r\n\r\n")) == 400
    assert len(lines(caplog)) == 6
    assert collector.healthz()["malformed_requests"] == 6
    still_serving(url)


def test_a_client_gone_mid_body_is_one_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    url, port, collector = served
    with socket.create_connection((LOCAL, port), timeout=10) as conn:
        conn.sendall(b"POST /v1/records HTTP/1.1\r\nHost: c\r\nContent-Length: 4000\r\n\r\n")
        conn.sendall(GOOD[:100])
    wait_for(lambda: any("mid-request" in m for m in lines(caplog)))
    assert lines(caplog) == [
        "127.0.0.1 (gpu01) POST /v1/records: connection closed mid-request (the client went away;"
        " 100 of 4000 body bytes)"
    ]
    assert collector.store.latest() == {}
    still_serving(url)


def test_a_client_gone_before_its_answer_is_one_line(
    served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, port, collector = served
    # the client is gone by the time the record is committed
    entered, stored = slow_ingest(monkeypatch, collector.store, 0.5)
    head = f"POST /v1/records HTTP/1.1\r\nHost: c\r\nContent-Length: {len(GOOD)}\r\n\r\n"
    with socket.create_connection((LOCAL, port), timeout=10) as conn:
        conn.sendall(head.encode() + GOOD)
        assert entered.wait(10)  # a worker has the request: its record is stored all the same
    wait_for(stored.is_set)
    wait_for(lambda: bool(gone(caplog)))
    time.sleep(0.2)
    (line,) = gone(caplog)  # before its answer, or with part of it unsent: one line
    assert line.startswith("127.0.0.1 (gpu01) POST /v1/records: the client went away")
    assert "gpu01" in collector.store.latest()
    still_serving(url)


def gone(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "disconnected" in r.getMessage() or "went away" in r.getMessage()
    ]


def test_200_aborted_connections_leave_no_traceback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    url, port, collector = served
    head = f"POST /v1/records HTTP/1.1\r\nHost: c\r\nContent-Length: {len(GOOD)}\r\n\r\n"
    for i in range(200):
        conn = socket.create_connection((LOCAL, port), timeout=10)
        # SO_LINGER 0: close() resets the connection (RST), as a killed client's kernel does.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.sendall(head.encode() + (GOOD if i % 2 else GOOD[: i + 1]))
        conn.close()
    wait_for(lambda: len(gone(caplog)) >= 100)  # every aborted body, one line each
    time.sleep(0.3)
    assert len(gone(caplog)) <= 200
    still_serving(url)
    status, _ = post(url, GOOD)
    assert status == 200
    assert collector.healthz()["status"] == "ok"


def test_a_megabyte_of_12000_events_stores_the_record_and_counts_the_rest(
    served: Served, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    url, port, collector = served
    events = [
        {"time": iso(T0 - i), "gpu": i % 8, "event": "xid", "code": 13, "detail": f"e{i:06d}"}
        for i in range(12000)
    ]
    body = json.dumps(record("gpu01", events=events), separators=(",", ":")).encode()
    assert 990_000 < len(body) <= MAX_BODY  # "1 MB": the probe
    answer = post_raw(port, body)
    assert status_of(answer) == 200
    assert any("11800 of 12000 not stored" in r for r in body_of(answer)["refused"])
    with collector.store.transaction() as db:
        stored = db.execute("SELECT count(*) FROM events WHERE node = 'gpu01'").fetchone()[0]
    assert stored == intake.EVENTS_PER_RECORD
    assert collector.healthz()["events_dropped"] == {"per_record": 11800, "per_node_hour": 0}
    collector.write_metrics(read_slurm=False)
    text = (tmp_path / "textfile" / "gpuforge_controller.prom").read_text()
    assert 'gpuforge_collector_events_dropped_total{limit="per_record"} 11800' in text
    assert len(lines(caplog)) == 1
    still_serving(url)


def test_events_are_capped_per_node_and_hour(make_decider: MakeDecider) -> None:
    leaves = {"gpu01": "leaf-a"}
    decider, _, store = make_decider(leaves)
    now = [T0]
    fleet = Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, leaves, {})
    collector = Collector(fleet, store, decider, clock=lambda: now[0],
                          max_events_per_record=5, max_events_per_node_hour=12)  # fmt: skip
    collector.start()
    try:
        for k in range(4):
            evs = [{"time": iso(T0 - k * 10 - i), "event": "xid", "code": 13} for i in range(6)]
            answer = collector.receive(json.dumps(record("gpu01", events=evs)).encode(), LOCAL)
            assert answer.status == 200
        assert collector.events.dropped == {"per_record": 4, "per_node_hour": 8}
        now[0] = T0 + 3600  # the next hour has its own budget
        evs = [{"time": iso(T0 + 3000), "event": "xid", "code": 13}]
        answer = collector.receive(
            json.dumps(record("gpu01", at=now[0], events=evs)).encode(), LOCAL
        )
        assert "refused" not in answer.body
    finally:
        collector.stop()
    with store.transaction() as db:
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 13
    assert len(store.node_history("gpu01")) >= 1  # every record stored


@pytest.mark.parametrize("at", [T0 + 3600, 253402300799.0], ids=["an-hour-ahead", "9999-12-31"])
def test_a_future_dated_record_is_refused_and_counted(
    served: Served, caplog: pytest.LogCaptureFixture, tmp_path: Path, at: float
) -> None:
    url, _, collector = served
    status, body = post(url, json.dumps(record("gpu01", at=at, verdict="pass")).encode())
    assert status == 422
    assert "clock is wrong" in body["error"]
    assert collector.store.latest() == {}
    assert collector.healthz()["future_dated"] == {"gpu01": 1}
    collector.write_metrics(read_slurm=False)
    text = (tmp_path / "textfile" / "gpuforge_controller.prom").read_text()
    assert 'gpuforge_collector_future_records_total{node="gpu01"} 1' in text
    assert 'gpuforge_collector_refused_records_total{why="future"} 1' in text
    assert len(lines(caplog)) == 1
    # A real record afterwards is the node's latest: nothing froze its state.
    status, _ = post(
        url, json.dumps(record("gpu01", verdict="fail", failed=(("gpu.xid", "reboot"),))).encode()
    )
    assert status == 200
    assert collector.store.latest()["gpu01"].verdict == "fail"


def test_a_record_within_the_skew_is_taken(served: Served) -> None:
    url, _, collector = served
    status, _ = post(url, json.dumps(record("gpu01", at=T0 + 200)).encode())
    assert status == 200
    assert "gpu01" in collector.store.latest()


def test_long_strings_are_clipped_and_named(served: Served) -> None:
    url, _, collector = served
    rec = record("gpu01", failed=(("gpu.xid", "reboot"),), verdict="fail")
    rec["checks"][1]["evidence"] = "Xid 79 " * 5000
    status, body = post(url, json.dumps(rec).encode())
    assert status == 200
    assert body["refused"] == ["checks[1].evidence: clipped from 35000 characters"]
    stored = json.loads(collector.store.latest()["gpu01"].record_json)
    assert len(stored["checks"][1]["evidence"]) <= intake.MAX_STRING


def test_duplicate_keys_and_lone_surrogates_are_refused(served: Served) -> None:
    url, _, _ = served
    dup = GOOD.replace(b'"verdict": "pass"', b'"verdict": "fail", "verdict": "pass"')
    status, body = post(url, dup)
    assert status == 400 and "appears twice" in body["error"]
    lone = GOOD.replace(b'"sha256:0"', b'"sha256:\\ud800"')
    status, body = post(url, lone)
    assert status == 400 and "config_digest" in body["error"]


def test_the_stored_text_is_as_sent_when_unchanged_else_canonical(served: Served) -> None:
    url, _, collector = served
    sent = b"  \n" + json.dumps(record("gpu01"), indent=4).encode() + b"\n"
    status, _ = post(url, sent)
    assert status == 200
    assert collector.store.latest()["gpu01"].record_json == sent.decode()
    rec = record("gpu01", at=T0 + 1)
    rec["checks"][0]["measured"] = float("nan")  # json.dumps writes NaN: not JSON
    status, body = post(url, json.dumps(rec).encode())
    assert status == 200 and body["refused"]
    text = collector.store.latest()["gpu01"].record_json
    assert text == intake.dumps(json.loads(text))
    assert json.loads(text)["checks"][0]["measured"] is None


@pytest.mark.parametrize(
    ("error", "status"),
    [(OverflowError("Python int too large to convert to SQLite INTEGER"), 400),
     (sqlite3.IntegrityError("NOT NULL constraint failed"), 400),
     (sqlite3.OperationalError("database or disk is full"), 503)],
)  # fmt: skip
def test_a_store_error_from_the_content_is_a_4xx_and_the_node_drops_it(
    served: Served, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int
) -> None:
    # node/output.py keeps a record on 408, 429 and 5xx and sends it again; on any other 4xx it
    # drops it. A record that can never be stored must not block the node's spool.
    url, _, collector = served

    def fail(*_: Any, **__: Any) -> Any:
        raise error

    monkeypatch.setattr(collector.store, "ingest", fail)
    got, body = post(url, GOOD)
    assert got == status
    assert "not stored" in body["error"]


def test_a_damaged_store_is_a_503_and_the_node_keeps_its_record(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A damaged page is the store's fault, not the record's: a 400 would make the node drop a
    # record the repaired store would take (docs/runbooks/history-store-damaged.md).
    url, _, collector = served
    damage = database.damaged(
        collector.store.path, SCHEMA, sqlite3.DatabaseError("database disk image is malformed")
    )

    def fail(*_: Any, **__: Any) -> Any:
        raise damage

    monkeypatch.setattr(collector.store, "ingest", fail)
    got, body = post(url, GOOD)
    assert got == 503
    assert "damaged (database disk image is malformed)" in body["error"]
    assert len([m for m in lines(caplog) if "the node sends it again" in m]) == 1
    still_serving(url)


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_intake_encoding_table() -> None:
    assert intake.encoding_problem(GOOD) is None
    assert intake.encoding_problem(b"{}") is None
    assert intake.encoding_problem("{}".encode("utf-32-le")) == "UTF-32 (little-endian)"
    assert intake.encoding_problem(b"\xff\xfe\x00\x00{") == (
        "UTF-32 (little-endian, with a byte order mark)"
    )
    with pytest.raises(intake.Refused, match="empty"):
        intake.canonical(b" \n")


def test_an_address_that_cannot_be_served_is_an_os_error(make_decider: MakeDecider) -> None:
    # `health serve` and conformance turn an OSError into "--listen ...: why", not a traceback.
    decider, _, store = make_decider({"gpu01": "leaf-a"})
    fleet = Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, {"gpu01": "leaf-a"}, {})
    collector = Collector(fleet, store, decider)
    with pytest.raises(OSError, match="does not resolve"):
        make_server(collector, "no-such-host.invalid", 0)
    with socket.socket() as taken:
        taken.bind((LOCAL, 0))
        taken.listen()
        with pytest.raises(OSError) as err:
            make_server(collector, LOCAL, taken.getsockname()[1])
    assert err.value.strerror


def test_a_slow_client_is_closed_after_the_idle_timeout_with_one_line(
    make_decider: MakeDecider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    decider, _, store = make_decider({"gpu01": "leaf-a"})
    fleet = Fleet("lab", ("gpu01",), {"gpu01": LOCAL}, {"gpu01": "leaf-a"}, {})
    collector = Collector(fleet, store, decider, clock=lambda: T0)
    collector.start()
    server = make_server(collector, LOCAL, 0, idle_timeout_s=1)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        slow = [socket.create_connection((LOCAL, port), timeout=10) for _ in range(20)]
        for conn in slow:
            conn.sendall(b"POST /v1/records HTTP/1.1\r\nHost: c\r\n")  # and nothing more
        assert post(f"http://{LOCAL}:{port}", GOOD)[0] == 200  # they hold no worker
        for conn in slow:
            assert conn.recv(100) == b""  # closed by the collector within the timeout
            conn.close()
        wait_for(lambda: len(lines(caplog)) >= 20)
        assert set(lines(caplog)) == {
            "127.0.0.1 (gpu01) POST /v1/records: connection closed: no complete request in 1 s"
            " (0 body bytes)"
        }
    finally:
        server.shutdown()
        server.server_close()
        collector.stop()
    assert_no_traceback(caplog)


def test_the_nodes_spool_drains_past_records_the_collector_will_never_take(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's rule (node/output.py): 2xx sent, any other 4xx but 408/429 dropped, 408, 429,
    # 5xx and network errors kept for the next run. Nothing hostile may block the spool.
    from gpuforge.node import config as node_config  # noqa: PLC0415
    from gpuforge.node import output  # noqa: PLC0415

    url, _, collector = served
    cfg = node_config.HealthConfig(
        node="gpu01", collector=node_config.CollectorConfig(url, 5.0), state_dir=tmp_path / "state"
    )
    spool = output.spool_dir(cfg)
    spool.mkdir(parents=True)
    big_code = json.dumps(
        record("gpu01", at=T0 - 10, events=[{"time": iso(T0), "event": "xid", "code": 2**70}])
    )
    bodies = {
        "1-bom": b"\xef\xbb\xbf" + GOOD,
        "2-utf16": GOOD.decode().encode("utf-16"),
        "3-future": json.dumps(record("gpu01", at=T0 + 86400)).encode(),
        "4-deep": b"[" * 200_000,
        "5-code": big_code.encode(),
        "6-good": GOOD,
    }
    for name, body in bodies.items():
        (spool / f"{name}.json").write_bytes(body)
    delivery = output.deliver(cfg, deadline=time.monotonic() + 30)
    assert (delivery.sent, delivery.error) == (2, "")
    assert output.spooled(cfg) == []
    assert collector.store.latest()["gpu01"].verdict == "pass"

    def full(*_: Any, **__: Any) -> Any:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(collector.store, "ingest", full)
    (spool / "7-good.json").write_bytes(GOOD)
    delivery = output.deliver(cfg, deadline=time.monotonic() + 30)
    assert delivery.sent == 0 and "HTTP 503" in delivery.error
    assert [p.name for p in output.spooled(cfg)] == ["7-good.json"]  # kept for the next run


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_a_client_that_resets_while_answered_is_one_line_naming_node_and_path(
    served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, close: bool
) -> None:
    # Seen on the lab (issue 28): a task that went away while the collector answered it
    # (BrokenPipeError / ConnectionResetError). A real socket, reset (RST) before its answer.
    url, port, collector = served
    # the client resets while its record is committed
    entered, stored = slow_ingest(monkeypatch, collector.store, 0.3)
    head = "POST /v1/records HTTP/1.1\r\nHost: c\r\n" + ("Connection: close\r\n" if close else "")
    head += f"Content-Length: {len(GOOD)}\r\n\r\n"
    conn = socket.create_connection((LOCAL, port), timeout=10)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sendall(head.encode() + GOOD)
    assert entered.wait(10)
    conn.close()  # RST: the answer meets ECONNRESET / EPIPE
    wait_for(stored.is_set)
    wait_for(lambda: bool(gone(caplog)))
    time.sleep(0.3)
    (line,) = gone(caplog)
    assert line.startswith("127.0.0.1 (gpu01) POST /v1/records: the client went away"), line
    assert "gpu01" in collector.store.latest()  # the record is stored all the same
    still_serving(url)


def test_a_peer_that_is_no_node_is_named_by_its_address_alone(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, collector = served
    assert collector.node_at("127.0.0.1") == "gpu01"
    assert collector.node_at("::ffff:10.231.0.12") == "gpu02"
    assert collector.node_at("10.9.9.9") is None
