"""Where fleet telemetry comes from besides a file: the history store, and Prometheus.

The store (:mod:`gpuforge.history`) keeps each node's counters at most hourly, and only when
they moved; its counter keys (``gpu/<i>/ecc_sbe_volatile``, ``ib/<device>/<port>/symbol_error``)
become samples under dcgm-exporter's and node_exporter's names (:data:`STORE_METRICS`). Its
events (Xids, drains, resumes, remediations, RMAs, failures) become telemetry events.

Prometheus is asked one ``/api/v1/query_range`` per metric the scorer reads
(:data:`gpuforge.predict.score.METRICS`, plus ``DCGM_FI_DEV_XID_ERRORS`` whose changes to a
non-zero code become Xid events). A series' node is its ``node`` label (the file_sd label of
docs/monitoring.md), else the host part of ``instance``; its GPU the ``gpu`` label; its port
``device/port``; its ``rack``, ``leaf`` and ``node_type`` labels become the node's labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from gpuforge.admission import format_reason
from gpuforge.errors import InputError
from gpuforge.history.store import HistoryEvent as StoreEvent
from gpuforge.history.store import HistoryStore
from gpuforge.predict.score import METRICS
from gpuforge.predict.telemetry import EVENTS, LABELS, Event, SeriesKey, Telemetry
from gpuforge.promclient import Prometheus

#: Store counter name (the last part of ``gpu/<i>/<name>``) -> metric name.
GPU_COUNTERS = {
    "ecc_sbe_volatile": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "ecc_dbe_volatile": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "remapped_rows_correctable": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "remapped_rows_uncorrectable": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
}
#: Store counter name (the last part of ``ib/<device>/<port>/<name>``, the sysfs counter file)
#: -> node_exporter's infiniband collector metric.
IB_COUNTERS = {
    "symbol_error": "node_infiniband_symbol_error_total",
    "link_downed": "node_infiniband_link_downed_total",
    "port_rcv_errors": "node_infiniband_port_errors_received_total",
    "port_xmit_discards": "node_infiniband_port_discards_transmitted_total",
}
STORE_METRICS = {**GPU_COUNTERS, **IB_COUNTERS}
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
_GPU_KEY = re.compile(r"^gpu/(?P<gpu>[0-9]+)/(?P<name>[a-z_]+)$")
_IB_KEY = re.compile(r"^ib/(?P<device>[^/]+)/(?P<port>[^/]+)/(?P<name>[a-z_]+)$")


def _sample_key(node: str, counter: str) -> SeriesKey | None:
    match = _GPU_KEY.match(counter)
    if match and match["name"] in GPU_COUNTERS:
        return SeriesKey(node, GPU_COUNTERS[match["name"]], gpu=int(match["gpu"]))
    match = _IB_KEY.match(counter)
    if match and match["name"] in IB_COUNTERS:
        port = f"{match['device']}/{match['port']}"
        return SeriesKey(node, IB_COUNTERS[match["name"]], port=port)
    return None


def _event(e: StoreEvent) -> Event | None:
    if e.kind not in EVENTS:
        return None  # refused, hold: admission's bookkeeping, not the node's history
    detail = e.detail
    if e.kind == "drain" and e.check and e.action:
        try:
            detail = format_reason(e.check, e.action)
        except InputError:
            detail = e.detail
    return Event(e.at, e.node, e.kind, e.gpu, e.code, detail)


def _carried(
    snaps: list[tuple[float, Mapping[str, Any]]], since: float | None, until: float | None
) -> list[tuple[float, Mapping[str, Any]]]:
    """Snapshots within ``[since, until]``, the last one before ``since`` moved to ``since``."""
    snaps.sort(key=lambda s: s[0])
    before = [s for s in snaps if since is not None and s[0] < since]
    inside = [
        s for s in snaps if (since is None or s[0] >= since) and (until is None or s[0] <= until)
    ]
    if before and since is not None:
        inside.insert(0, (since, before[-1][1]))
    return inside


def from_store(
    store: HistoryStore,
    *,
    since: float | None = None,
    until: float | None = None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    source: str = "store",
) -> Telemetry:
    """The counters and events the history store holds between ``since`` and ``until``."""
    telemetry = Telemetry(source=source)
    for node, tags in (labels or {}).items():
        telemetry.labels[node] = dict(tags)
    points: dict[SeriesKey, list[tuple[float, float]]] = {}
    latest = store.latest()
    for node in sorted(latest):
        # the store keeps a snapshot only when a counter moved: a gap means "unchanged", so the
        # value before the window is carried to its start and the newest record's to its time
        snaps = [(s.at, s.counters) for s in store.counters(node)]
        row = latest[node]
        if until is None or row.at <= until:
            snaps.append((row.at, dict(row.record.get("counters") or {})))
        for at, counters in _carried(snaps, since, until):
            for counter, value in counters.items():
                key = _sample_key(node, counter)
                if key is not None and isinstance(value, int | float):
                    points.setdefault(key, []).append((at, float(value)))
    for key, pairs in points.items():
        by_time = sorted(dict(pairs).items())
        telemetry.series[key] = (
            np.asarray([p[0] for p in by_time], dtype=np.float64),
            np.asarray([p[1] for p in by_time], dtype=np.float64),
        )
    for e in store.events(since=since, until=until):
        mapped = _event(e)
        if mapped is not None:
            telemetry.events.append(mapped)
    return telemetry


# -- Prometheus ---------------------------------------------------------------------------------


def _node_of(labels: Mapping[str, str]) -> str | None:
    if labels.get("node"):
        return labels["node"]
    instance = labels.get("instance", "")
    return instance.rsplit(":", 1)[0] if instance else None


def _prom_key(metric: str, labels: Mapping[str, str]) -> SeriesKey | None:
    node = _node_of(labels)
    if node is None:
        return None
    gpu = labels.get("gpu")
    if gpu is not None and gpu.isdigit():
        return SeriesKey(node, metric, gpu=int(gpu))
    if labels.get("device") and labels.get("port"):
        return SeriesKey(node, metric, port=f"{labels['device']}/{labels['port']}")
    return SeriesKey(node, metric)


def from_prometheus(
    base_url: str,
    *,
    start: float,
    end: float,
    step_s: float = 300.0,
    timeout: float = 30.0,
    metrics: Iterable[str] = METRICS,
) -> Telemetry:
    """Range queries over the scorer's metrics between ``start`` and ``end``."""
    prometheus = Prometheus(base_url, timeout=timeout)
    telemetry = Telemetry(source=prometheus.root)
    for metric in (*metrics, XID_METRIC):
        answer = prometheus.query_range(metric, start=start, end=end, step_s=step_s)
        for series in answer:
            _add_series(telemetry, metric, series)
    telemetry.events.sort(key=lambda e: e.time)
    return telemetry


def _add_series(telemetry: Telemetry, metric: str, series: Mapping[str, Any]) -> None:
    labels = {str(k): str(v) for k, v in dict(series.get("metric", {})).items()}
    key = _prom_key(metric, labels)
    if key is None:
        return
    tags = {k: labels[k] for k in LABELS if labels.get(k)}
    if tags:
        telemetry.labels.setdefault(key.node, {}).update(tags)
    values = series.get("values", [])
    t = np.asarray([float(v[0]) for v in values], dtype=np.float64)
    x = np.asarray([float(v[1]) for v in values], dtype=np.float64)
    finite = np.isfinite(x)
    t, x = t[finite], x[finite]
    if metric == XID_METRIC:
        # dcgm-exporter reports the last Xid as a gauge: each change to a non-zero code is one
        changed = np.nonzero((x != 0) & (np.diff(x, prepend=0.0) != 0))[0]
        for i in changed:
            telemetry.events.append(Event(float(t[i]), key.node, "xid", key.gpu, int(x[i])))
        return
    old = telemetry.series.get(key)
    if old is not None:  # the same node and subject from two exporters' series: merge
        t = np.concatenate([old[0], t])
        x = np.concatenate([old[1], x])
        order = np.argsort(t, kind="stable")
        t, x = t[order], x[order]
    telemetry.series[key] = (t, x)
