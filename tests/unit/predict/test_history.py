"""The history format: round trip, and malformed lines reported by number, never a traceback."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from gpuforge.errors import InputError
from gpuforge.predict.history import (
    SCHEMA,
    Event,
    History,
    SeriesKey,
    read_history,
    read_lines,
    write_history,
)

HEADER = json.dumps({"schema": SCHEMA})
SAMPLE = (
    '{"time": "2026-11-30T19:20:00Z", "node": "gpu01", "gpu": 3, "port": null, '
    '"metric": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "value": 12}'
)
EVENT = '{"time": "2026-11-30T19:25:00Z", "node": "gpu01", "gpu": 3, "event": "xid", "code": 79}'


def test_round_trip_keeps_series_events_and_labels(tmp_path: Path) -> None:
    history = History()
    t = np.array([1_795_000_000.0, 1_795_000_300.0])
    history.series[SeriesKey("gpu01", "DCGM_FI_DEV_GPU_TEMP", gpu=0)] = (t, np.array([41.0, 42.5]))
    history.series[SeriesKey("gpu01", "node_infiniband_symbol_error_total", port="mlx5_0/1")] = (
        t,
        np.array([0.0, 3.0]),
    )
    history.events.append(Event(1_795_000_100.0, "gpu01", "xid", 0, 31, "MMU fault"))
    history.labels["gpu01"] = {"rack": "r1", "leaf": "leaf1", "node_type": "h100"}
    out = io.StringIO()
    lines = write_history(history, out)
    path = tmp_path / "h.jsonl"
    path.write_text(out.getvalue())
    back = read_history(path)
    assert lines == 1 + 1 + 4 + 1
    assert back.labels == history.labels
    assert back.events == history.events
    for key, (times, values) in history.series.items():
        assert np.array_equal(back.series[key][0], times)
        assert np.array_equal(back.series[key][1], values)
    assert back.skipped == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "must be a JSON object"),
        (SAMPLE.replace('"gpu": 3', '"gpu": true'), "gpu: must be a GPU index"),
        (SAMPLE.replace('"value": 12', '"value": "12"'), "value: must be a finite number"),
        (SAMPLE.replace("2026-11-30T19:20:00Z", "2026-11-30 19:20"), "has no time zone"),
        (SAMPLE.replace('"port": null, ', ""), "port: missing"),
        (SAMPLE.replace('"value": 12', '"value": 12, "unit": "x"'), "unit: unknown field"),
        (EVENT.replace('"xid"', '"reboot"'), "event: 'reboot' is not one of"),
        (EVENT.replace('"code": 79', '"code": "79"'), "code: must be an integer"),
    ],
)
def test_malformed_line_is_refused_with_its_number_and_field(line: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        read_lines([HEADER, SAMPLE, line, EVENT], source="h.jsonl")
    assert str(info.value).startswith("h.jsonl:3: ")
    assert message in str(info.value)


def test_skip_reports_each_malformed_line_and_keeps_the_rest() -> None:
    lines = [HEADER, SAMPLE, "{broken", EVENT, '{"time": 1}']
    history = read_lines(lines, source="h.jsonl", on_error="skip")
    assert [e.line for e in history.skipped] == [3, 5]
    assert len(history.series) == 1 and len(history.events) == 1
    assert history.lines == 5


def test_a_file_without_the_header_or_of_another_version_is_refused() -> None:
    with pytest.raises(InputError, match=r"h.jsonl:1: expected the header"):
        read_lines([SAMPLE], source="h.jsonl", on_error="skip")
    with pytest.raises(InputError, match=r"is not 'gpuforge\.history/1'"):
        read_lines(['{"schema": "gpuforge.history/2"}', SAMPLE], source="h.jsonl")
    with pytest.raises(InputError, match="empty history"):
        read_lines([], source="h.jsonl")


def test_unreadable_file_is_one_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the history"):
        read_history(tmp_path / "missing.jsonl")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        read_history(binary)


def test_samples_out_of_order_are_sorted_by_time() -> None:
    later = SAMPLE.replace("19:20:00Z", "19:30:00Z").replace('"value": 12', '"value": 20')
    history = read_lines([HEADER, later, SAMPLE], source="h.jsonl")
    ((times, values),) = history.series.values()
    assert list(values) == [12.0, 20.0]
    assert times[0] < times[1]
