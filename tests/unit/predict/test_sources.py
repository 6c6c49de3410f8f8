"""Sources: Prometheus range queries (a fake HTTP server) and the state store's export."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError, OperationError
from gpuforge.history.store import HistoryStore
from gpuforge.predict.score import score_telemetry
from gpuforge.predict.signals import Window
from gpuforge.predict.sources import from_prometheus, from_store
from gpuforge.predict.telemetry import SeriesKey
from tests.unit.history.records import T0, record

LABELS = {"node": "gpu01", "rack": "r1", "leaf": "leaf1", "node_type": "h100", "job": "dcgm"}


def _matrix(metric: str) -> list[dict[str, Any]]:
    if metric == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL":
        return [
            {
                "metric": {**LABELS, "__name__": metric, "gpu": "3", "instance": "10.0.0.1:9400"},
                "values": [[T0, "1"], [T0 + 300, "5"], [T0 + 600, "NaN"]],
            }
        ]
    if metric == "node_infiniband_symbol_error_total":
        labels = {"instance": "gpu02:9100", "device": "mlx5_0", "port": "1"}
        return [{"metric": labels, "values": [[T0, "0"], [T0 + 300, "2"]]}]
    if metric == "DCGM_FI_DEV_XID_ERRORS":
        values = [[T0, "0"], [T0 + 300, "79"], [T0 + 600, "79"], [T0 + 900, "31"]]
        return [{"metric": {**LABELS, "gpu": "1"}, "values": values}]
    return []


class _Prometheus(BaseHTTPRequestHandler):
    queries: list[dict[str, list[str]]] = []  # noqa: RUF012 - the fake's record of requests

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        args = urllib.parse.parse_qs(url.query)
        type(self).queries.append(args)
        if url.path != "/api/v1/query_range":
            self.send_error(404)
            return
        metric = args["query"][0]
        if metric == "DCGM_FI_DEV_SM_CLOCK" and self.server.fail_clock:  # type: ignore[attr-defined]
            body = {"status": "error", "errorType": "bad_data", "error": "query timed out"}
        else:
            body = {
                "status": "success",
                "data": {"resultType": "matrix", "result": _matrix(metric)},
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    server.fail_clock = False  # type: ignore[attr-defined]
    _Prometheus.queries = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_range_queries_become_series_labels_and_xid_events(prometheus: ThreadingHTTPServer) -> None:
    telemetry = from_prometheus(_url(prometheus), start=T0, end=T0 + 900, step_s=300, timeout=5)
    ecc = telemetry.series[SeriesKey("gpu01", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu=3)]
    assert list(ecc[1]) == [1.0, 5.0]  # NaN dropped
    ib = telemetry.series[SeriesKey("gpu02", "node_infiniband_symbol_error_total", port="mlx5_0/1")]
    assert list(ib[1]) == [0.0, 2.0]
    assert telemetry.labels["gpu01"] == {"rack": "r1", "leaf": "leaf1", "node_type": "h100"}
    assert [(e.code, e.gpu, e.time) for e in telemetry.events] == [
        (79, 1, T0 + 300),
        (31, 1, T0 + 900),
    ]
    first = _Prometheus.queries[0]
    assert first["start"] == [f"{T0:.3f}"] and first["step"] == ["300"]


def test_a_failing_query_or_an_unreachable_server_is_an_operation_error(
    prometheus: ThreadingHTTPServer,
) -> None:
    prometheus.fail_clock = True  # type: ignore[attr-defined]
    with pytest.raises(OperationError, match=r"query DCGM_FI_DEV_SM_CLOCK failed: query timed out"):
        from_prometheus(_url(prometheus), start=T0, end=T0 + 900, timeout=5)
    with pytest.raises(OperationError, match=r"Prometheus http://127\.0\.0\.1:9: DCGM_"):
        from_prometheus("http://127.0.0.1:9/", start=T0, end=T0 + 900, timeout=2)
    with pytest.raises(InputError, match="not an http"):
        from_prometheus("file:///etc/passwd", start=T0, end=T0 + 900)


def test_store_counters_and_events_become_telemetry(tmp_path: Path) -> None:
    with HistoryStore.open(tmp_path / "history.db") as store:
        for hour, sbe in enumerate((0, 4, 40)):
            counters = {"gpu/3/ecc_sbe_volatile": sbe, "ib/mlx5_0/1/symbol_error": hour}
            store.ingest([record("gpu01", at=T0 + hour * 3600, counters=counters)])
        store.add_event("gpu01", "xid", at=T0 + 100, code=79, gpu=3)
        store.add_event("gpu01", "drain", at=T0 + 200, check="gpu.xid", action="reboot")
        store.add_event("gpu01", "refused", at=T0 + 300, check="gpu.xid", action="reboot")
        telemetry = from_store(store, labels={"gpu01": {"rack": "r1"}})
    ecc = telemetry.series[SeriesKey("gpu01", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu=3)]
    assert list(ecc[1]) == [0.0, 4.0, 40.0]
    assert (
        SeriesKey("gpu01", "node_infiniband_symbol_error_total", port="mlx5_0/1")
        in telemetry.series
    )
    assert [(e.event, e.code, e.detail) for e in telemetry.events] == [
        ("xid", 79, ""),
        ("drain", None, "gpuforge:gpu.xid:reboot"),
    ]
    assert telemetry.labels == {"gpu01": {"rack": "r1"}}


def test_store_gaps_mean_unchanged_so_a_quiet_node_spans_the_window(tmp_path: Path) -> None:
    """The store snapshots counters only when they move: a quiet node is not 'too little data'."""
    counters = {"gpu/0/ecc_sbe_volatile": 7}
    with HistoryStore.open(tmp_path / "history.db") as store:
        store.ingest([record("gpu01", at=T0, counters=counters)])
        store.ingest([record("gpu01", at=T0 + 5 * 86400, counters=counters)])
        telemetry = from_store(store, since=T0 + 86400)
    times, values = telemetry.series[SeriesKey("gpu01", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu=0)]
    assert list(times) == [T0 + 86400, T0 + 5 * 86400]  # carried to the window's start
    assert list(values) == [7.0, 7.0]
    report = score_telemetry(telemetry, Window(T0 + 5 * 86400, 4 * 86400))
    assert [(r.node, r.status) for r in report.nodes] == [("gpu01", "scored")]
