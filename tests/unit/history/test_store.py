"""The history store: changes kept in full, snapshots bounded, events once, bad files refused."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from gpuforge import database
from gpuforge.errors import InputError
from gpuforge.history import HistoryStore, Retention, history_path
from gpuforge.history.store import SCHEMA

from .records import T0, record


@pytest.fixture
def store(tmp_path: Path) -> HistoryStore:
    return HistoryStore.open(history_path(tmp_path, "lab"))


def test_path_sits_beside_the_admission_record(tmp_path: Path) -> None:
    from gpuforge.admission import record_path  # noqa: PLC0415

    assert history_path(tmp_path, "lab").parent == record_path(tmp_path, "lab").parent


def test_only_verdict_changes_are_kept_and_latest_is_the_newest(store: HistoryStore) -> None:
    for i in range(10):  # ten identical passes: one change (the first record)
        store.ingest([record(at=T0 + 300 * i)])
    failing = record(at=T0 + 3000, verdict="fail", failed=(("gpu.xid", "reboot"),))
    result = store.ingest([failing])
    assert result.changes == 1
    store.ingest([record(at=T0 + 3300, verdict="fail", failed=(("gpu.xid", "reboot"),))])
    history = store.node_history("gpu01")
    verdicts = [h for h in history if h.kind == "verdict"]
    assert [(h.verdict, h.previous) for h in verdicts] == [("fail", "pass"), ("pass", None)]
    assert verdicts[0].checks == "gpu.xid=fail:reboot"
    assert [h.kind for h in history if h.kind != "verdict"] == ["failure"]
    latest = store.latest()["gpu01"]
    assert latest.at == T0 + 3300
    assert latest.record["checks"][1]["check"] == "gpu.xid"
    assert store.changes("gpu01")[1] == failing  # the change is kept in full


def test_a_different_failing_check_is_a_change_with_the_same_verdict(store: HistoryStore) -> None:
    store.ingest([record(verdict="fail", failed=(("gpu.xid", "reboot"),))])
    result = store.ingest([record(at=T0 + 300, verdict="fail", failed=(("gpu.nvlink", "reboot"),))])
    assert result.changes == 1


def test_a_record_overtaken_in_flight_neither_replaces_latest_nor_changes(
    store: HistoryStore,
) -> None:
    # The node's sequence says it was sent before the latest: its events count, its verdict not.
    store.ingest([record(at=T0 + 600)], sequences=[2])
    xid = {"time": "2026-11-18T07:00:00Z", "gpu": 3, "event": "xid", "code": 79, "detail": "x"}
    result = store.ingest([record(at=T0, verdict="fail", failed=(("gpu.xid", "reboot"),),
                                  events=[xid])], sequences=[1])  # fmt: skip
    assert (result.changes, result.events) == (0, 1)
    assert store.latest()["gpu01"].verdict == "pass"
    assert [e.code for e in store.events(kinds=["xid"])] == [79]


def _seq(store: HistoryStore, node: str = "gpu01") -> int | None:
    with store.read() as db:
        row = db.execute("SELECT seq FROM latest WHERE node = ?", (node,)).fetchone()
    return None if row is None else row[0]


def test_a_record_dated_in_the_past_after_a_newer_one_still_changes_the_verdict(
    store: HistoryStore,
) -> None:
    """The order is the collector's: a node whose clock jumped a day back is not frozen."""
    store.ingest([record(at=T0)], received=T0, sequences=[10])
    back = T0 - 86400
    result = store.ingest([record(at=back, verdict="warn", failed=(("gpu.throttle", "inspect"),),
                                  status="warn")], received=T0 + 300, sequences=[11])  # fmt: skip
    assert result.changes == 1
    latest = store.latest()["gpu01"]
    assert (latest.verdict, latest.at, latest.received) == ("warn", back, T0 + 300)
    assert _seq(store) == 11
    # Without sequences (a collector without munge): the later received wins all the same.
    store.ingest([record("gpu02", at=T0)])
    store.ingest([record("gpu02", at=back, verdict="fail", failed=(("gpu.xid", "reboot"),))])
    assert store.latest()["gpu02"].verdict == "fail"
    assert _seq(store, "gpu02") is None


def test_a_fail_after_a_past_dated_record_records_the_failure_event(store: HistoryStore) -> None:
    store.ingest([record(at=T0)], received=T0, sequences=[1])
    store.ingest([record(at=T0 - 86400)], received=T0 + 300, sequences=[2])  # the clock went back
    failing = record(at=T0 - 86400 + 300, verdict="fail", failed=(("gpu.xid", "reboot"),))
    result = store.ingest([failing], received=T0 + 600, sequences=[3])
    assert result.changes == 1
    assert store.latest()["gpu01"].verdict == "fail"
    failures = store.events(kinds=["failure"], node="gpu01")
    assert [(e.at, e.check, e.detail) for e in failures] == [
        (T0 - 86400 + 300, "gpu.xid", "gpu.xid=fail:reboot")  # dated by the node, as shown
    ]
    # Newest first in the order received: the change that arrived last is on top, although the
    # node dated it a day before the first (both times are kept).
    verdicts = [h for h in store.node_history("gpu01") if h.kind == "verdict"]
    assert [(h.verdict, h.previous) for h in verdicts] == [("fail", "pass"), ("pass", None)]
    assert [(h.received, h.at) for h in verdicts] == [(T0 + 600, T0 - 86400 + 300), (T0, T0)]


def test_a_version_2_history_migrates_keeping_its_latest_rows(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    old = database.open_database(path, replace(SCHEMA, steps=SCHEMA.steps[:2]))
    with old.transaction() as db:
        db.execute(
            "INSERT INTO latest VALUES ('gpu01', 'passive', ?, ?, 'pass', '', NULL, ?)",
            (T0, T0, json.dumps(record(at=T0))),
        )
    old.close()
    with HistoryStore.open(path, readonly=True) as reader:  # a reader reads it as it is
        assert reader.database.version == 2
        assert reader.latest()["gpu01"].verdict == "pass"
    with HistoryStore.open(path) as store:
        assert store.database.version == SCHEMA.version == 4
        assert _seq(store) is None
        failing = record(at=T0 - 86400, verdict="fail", failed=(("gpu.xid", "reboot"),))
        assert store.ingest([failing], sequences=[5]).changes == 1
        assert (store.latest()["gpu01"].verdict, _seq(store)) == ("fail", 5)
    assert (tmp_path / "history.db.v2.bak").is_file()


def test_a_version_3_history_gets_receive_times_from_its_rows_own(tmp_path: Path) -> None:
    """Step 4 adds ``received`` to verdicts and events: old rows take their own time, the only
    one they have; a reader of a file not yet migrated orders by that time too."""
    path = tmp_path / "history.db"
    old = database.open_database(path, replace(SCHEMA, steps=SCHEMA.steps[:3]))
    with old.transaction() as db:
        db.execute(
            "INSERT INTO verdicts (node, tier, at, verdict, previous, signature)"
            " VALUES ('gpu01', 'passive', ?, 'pass', NULL, '')",
            (T0,),
        )
        db.execute(
            "INSERT INTO events (at, node, kind, source) VALUES (?, 'gpu01', 'drain', 'health')",
            (T0 + 60,),
        )
    old.close()
    with HistoryStore.open(path, readonly=True) as reader:
        assert reader.database.version == 3
        assert [(h.kind, h.received) for h in reader.node_history("gpu01")] == [
            ("drain", T0 + 60),
            ("verdict", T0),
        ]
    with HistoryStore.open(path) as store:
        assert store.database.version == 4
        with store.read() as db:
            assert db.execute("SELECT received FROM verdicts").fetchall() == [(T0,)]
            assert db.execute("SELECT received FROM events").fetchall() == [(T0 + 60,)]
        # A record of a node 20 minutes behind, received after both: on top, its time beside.
        store.ingest([record(at=T0 - 1200, verdict="fail", failed=(("gpu.xid", "reboot"),))],
                     received=T0 + 120)  # fmt: skip
        assert [(h.kind, h.received, h.at) for h in store.node_history("gpu01")][:2] == [
            ("verdict", T0 + 120, T0 - 1200),
            ("failure", T0 + 120, T0 - 1200),
        ]
    assert (tmp_path / "history.db.v3.bak").is_file()


@pytest.mark.parametrize("offset", [-1200.0, 240.0], ids=["behind-20min", "ahead-4min"])
def test_a_nodes_history_is_in_the_order_received_whatever_its_clock(
    store: HistoryStore, offset: float
) -> None:
    """A node's clock ``offset`` from the collector's (behind 20 minutes, or ahead within the
    300 s the collector allows): its history lists what arrived in the order it arrived, the
    controller's drain between the failure that caused it and the recovery after it."""
    fail = record(at=T0 + offset, verdict="fail", failed=(("gpu.xid", "reboot"),))
    store.ingest([record(at=T0 - 300 + offset)], received=T0 - 300)
    store.ingest([fail], received=T0)
    store.add_event("gpu01", "drain", at=T0 + 1, check="gpu.xid", action="reboot", source="health")
    store.ingest([record(at=T0 + 300 + offset)], received=T0 + 300)
    history = store.node_history("gpu01")
    assert [(h.kind, h.verdict) for h in history] == [
        ("verdict", "pass"),
        ("drain", ""),
        ("verdict", "fail"),
        ("failure", ""),
        ("verdict", "pass"),
    ]
    assert [h.received for h in history] == [T0 + 300, T0 + 1, T0, T0, T0 - 300]
    assert history[0].at == T0 + 300 + offset  # the node's time, kept beside it
    # --since and --limit by arrival too: the last 301 s hold the drain and the recovery.
    assert [h.kind for h in store.node_history("gpu01", since=T0 + 1)] == ["verdict", "drain"]
    assert [h.kind for h in store.node_history("gpu01", limit=2)] == ["verdict", "drain"]


def test_snapshots_stay_hourly_when_the_clock_jumps_backwards(store: HistoryStore) -> None:
    for i in range(12):  # an hour every 5 minutes: one snapshot
        store.ingest([record(at=T0 + 300 * i, counters={"c": i})])
    back = T0 - 30 * 86400 + 3600  # the clock jumped a month back, the counters move on
    for i in range(25):  # two hours of the node's new time: a snapshot an hour, not frozen
        store.ingest([record(at=back + 300 * i, counters={"c": 100 + i})])
    assert [s.at for s in store.counters("gpu01")] == [back, back + 3600, back + 7200, T0]


def test_node_events_are_stored_once_however_often_resent(store: HistoryStore) -> None:
    xid = {"time": "2026-11-18T07:00:00Z", "gpu": 3, "event": "xid", "code": 79, "detail": "fell"}
    store.ingest([record(events=[xid])])
    store.ingest([record(at=T0 + 300, events=[xid])])
    events = store.events(kinds=["xid"], node="gpu01")
    assert len(events) == 1
    assert (events[0].gpu, events[0].code, events[0].source) == (3, 79, "node")


def test_snapshots_at_most_hourly_and_only_when_counters_moved(store: HistoryStore) -> None:
    for i in range(24):  # two hours every 5 minutes, the counter moving every time
        store.ingest([record(at=T0 + 300 * i, counters={"ib/mlx5_0/1/symbol_error": i})])
    snaps = store.counters("gpu01")
    assert [s.at - T0 for s in snaps] == [0, 3600]
    for i in range(24, 48):  # two more hours, nothing moving: nothing stored
        store.ingest([record(at=T0 + 300 * i, counters={"ib/mlx5_0/1/symbol_error": 23})])
    assert [s.at - T0 for s in store.counters("gpu01")] == [0, 3600, 7200]


def test_a_verdict_change_takes_a_snapshot_at_once(store: HistoryStore) -> None:
    store.ingest([record()])
    store.ingest([record(at=T0 + 300, verdict="fail", failed=(("fabric.counters", "quarantine"),),
                         counters={"ib/mlx5_0/1/symbol_error": 500})])  # fmt: skip
    assert [s.counters["ib/mlx5_0/1/symbol_error"] for s in store.counters("gpu01")] == [0, 500]


def test_add_event_and_filters(store: HistoryStore) -> None:
    store.add_event("gpu01", "drain", at=T0, check="gpu.xid", action="reboot", source="health")
    store.add_event("gpu02", "rma", at=T0 + 10, source="rma", data={"bundle": "x.tar.gz"})
    assert [e.node for e in store.events(kinds=["rma"])] == ["gpu02"]
    assert store.events(kinds=["rma"])[0].data == {"bundle": "x.tar.gz"}
    assert [e.kind for e in store.events(since=T0 + 5)] == ["rma"]
    with pytest.raises(InputError, match="unknown event kind"):
        store.add_event("gpu01", "party")


def test_a_bad_record_writes_nothing_of_its_batch(store: HistoryStore) -> None:
    bad = record(node="gpu02")
    bad["verdict"] = "green"
    with pytest.raises(InputError, match="record from gpu02: verdict"):
        store.ingest([record(), bad])
    assert store.latest() == {}


def test_prune_keeps_latest_and_drops_old_rows(store: HistoryStore) -> None:
    store.ingest([record(counters={"c": 1})])
    store.ingest([record(at=T0 + 40 * 86400, verdict="fail", failed=(("gpu.xid", "reboot"),),
                         counters={"c": 2})])  # fmt: skip
    gone = store.prune(Retention(snapshot_days=30, history_days=400), now=T0 + 41 * 86400)
    assert gone == {"snapshots": 1, "verdicts": 0, "events": 0, "rolled_up": 1}
    assert store.latest()["gpu01"].verdict == "fail"
    # the first (pass) change lost its record, the fail change kept it; both are in the history
    assert [c["verdict"] for c in store.changes("gpu01")] == ["fail"]
    assert [h.verdict for h in store.node_history("gpu01") if h.kind == "verdict"] == [
        "fail",
        "pass",
    ]
    gone = store.prune(now=T0 + 500 * 86400)
    assert gone["verdicts"] == 2 and gone["rolled_up"] == 0


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "empty file"),
        (b"this is not sqlite at all" * 100, "not a database"),
    ],
)
def test_an_unreadable_file_is_refused_and_left_alone(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = history_path(tmp_path, "lab")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(InputError, match=why) as info:
        HistoryStore.open(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


def test_another_programs_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    before = path.read_bytes()
    with pytest.raises(InputError, match="another program's file"):
        HistoryStore.open(path)
    assert path.read_bytes() == before


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    HistoryStore.open(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(InputError, match="newer than this gpuforge"):
        HistoryStore.open(path)


def test_reopening_keeps_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with HistoryStore.open(path) as s:
        s.ingest([record()])
    with HistoryStore.open(path, create=False) as s:
        assert list(s.latest()) == ["gpu01"]
    with pytest.raises(InputError, match="no history database"):
        HistoryStore.open(tmp_path / "nope.db", create=False)
