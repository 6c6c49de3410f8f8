"""The history store: changes kept in full, snapshots bounded, events once, bad files refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.history import HistoryStore, Retention, history_path

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


def test_a_late_spooled_record_neither_replaces_latest_nor_changes(store: HistoryStore) -> None:
    store.ingest([record(at=T0 + 600)])
    xid = {"time": "2026-11-18T07:00:00Z", "gpu": 3, "event": "xid", "code": 79, "detail": "x"}
    result = store.ingest([record(at=T0, verdict="fail", failed=(("gpu.xid", "reboot"),),
                                  events=[xid])])  # fmt: skip
    assert (result.changes, result.events) == (0, 1)
    assert store.latest()["gpu01"].verdict == "pass"
    assert [e.code for e in store.events(kinds=["xid"])] == [79]


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
