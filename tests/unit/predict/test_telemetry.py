"""The telemetry format: round trip, and malformed lines reported by number, never a traceback."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from gpuforge.errors import InputError
from gpuforge.predict.telemetry import (
    LEGACY_SCHEMA,
    SCHEMA,
    Event,
    SeriesKey,
    Telemetry,
    read_lines,
    read_telemetry,
    write_telemetry,
)

HEADER = json.dumps({"schema": SCHEMA})
SAMPLE = (
    '{"time": "2026-11-30T19:20:00Z", "node": "gpu01", "gpu": 3, "port": null, '
    '"metric": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "value": 12}'
)
EVENT = '{"time": "2026-11-30T19:25:00Z", "node": "gpu01", "gpu": 3, "event": "xid", "code": 79}'


def test_round_trip_keeps_series_events_and_labels(tmp_path: Path) -> None:
    telemetry = Telemetry()
    t = np.array([1_795_000_000.0, 1_795_000_300.0])
    telemetry.series[SeriesKey("gpu01", "DCGM_FI_DEV_GPU_TEMP", gpu=0)] = (
        t,
        np.array([41.0, 42.5]),
    )
    telemetry.series[SeriesKey("gpu01", "node_infiniband_symbol_error_total", port="mlx5_0/1")] = (
        t,
        np.array([0.0, 3.0]),
    )
    telemetry.events.append(Event(1_795_000_100.0, "gpu01", "xid", 0, 31, "MMU fault"))
    telemetry.labels["gpu01"] = {"rack": "r1", "leaf": "leaf1", "node_type": "h100"}
    out = io.StringIO()
    lines = write_telemetry(telemetry, out)
    path = tmp_path / "h.jsonl"
    path.write_text(out.getvalue())
    back = read_telemetry(path)
    assert lines == 1 + 1 + 4 + 1
    assert back.labels == telemetry.labels
    assert back.events == telemetry.events
    for key, (times, values) in telemetry.series.items():
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
    telemetry = read_lines(lines, source="h.jsonl", on_error="skip")
    assert [e.line for e in telemetry.skipped] == [3, 5]
    assert len(telemetry.series) == 1 and len(telemetry.events) == 1
    assert telemetry.lines == 5


def test_the_header_written_is_telemetry_1() -> None:
    out = io.StringIO()
    assert write_telemetry(Telemetry(), out) == 1
    assert out.getvalue() == '{"schema": "gpuforge.telemetry/1"}\n'
    assert SCHEMA == "gpuforge.telemetry/1"


@pytest.mark.parametrize("schema", ["gpuforge.telemetry/1", "gpuforge.history/1"])
def test_both_headers_read_as_the_same_format(tmp_path: Path, schema: str) -> None:
    """``gpuforge.history/1`` is what gpuforge wrote before the rename: the same lines."""
    path = tmp_path / "fleet.jsonl"
    path.write_text("\n".join([json.dumps({"schema": schema}), SAMPLE, EVENT]) + "\n")
    telemetry = read_telemetry(path)
    assert [v.tolist() for _, v in telemetry.series.values()] == [[12.0]]
    assert [(e.event, e.code, e.gpu) for e in telemetry.events] == [("xid", 79, 3)]
    assert telemetry.skipped == [] and telemetry.lines == 3
    assert LEGACY_SCHEMA == "gpuforge.history/1"


def test_a_file_without_the_header_or_of_another_version_is_refused() -> None:
    with pytest.raises(InputError, match=r"h.jsonl:1: expected the header"):
        read_lines([SAMPLE], source="h.jsonl", on_error="skip")
    with pytest.raises(InputError, match=r"is not 'gpuforge\.telemetry/1'"):
        read_lines(['{"schema": "gpuforge.history/2"}', SAMPLE], source="h.jsonl")
    with pytest.raises(InputError, match=r"h.jsonl:1: schema: 'gpuforge\.telemetry/2' is not"):
        read_lines(['{"schema": "gpuforge.telemetry/2"}', SAMPLE], source="h.jsonl")
    with pytest.raises(InputError, match="empty telemetry"):
        read_lines([], source="h.jsonl")


def test_unreadable_file_is_one_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the telemetry"):
        read_telemetry(tmp_path / "missing.jsonl")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        read_telemetry(binary)


def test_samples_out_of_order_are_sorted_by_time() -> None:
    later = SAMPLE.replace("19:20:00Z", "19:30:00Z").replace('"value": 12', '"value": 20')
    telemetry = read_lines([HEADER, later, SAMPLE], source="h.jsonl")
    ((times, values),) = telemetry.series.values()
    assert list(values) == [12.0, 20.0]
    assert times[0] < times[1]
