"""Small hand-built fleet telemetry for the predict tests (hourly samples, known faults)."""

from __future__ import annotations

import numpy as np

from gpuforge.predict.score import ECC_SBE, GPU_TEMP, IB_SYMBOL, REMAP_CORRECTABLE
from gpuforge.predict.signals import DAY_S, HOUR_S
from gpuforge.predict.telemetry import Event, SeriesKey, Telemetry

T0 = 1_795_000_000.0  # 2026-11-18, inside the project's test calendar
DAYS = 8
AT = T0 + DAYS * DAY_S


def times() -> np.ndarray:
    """Hourly sample times over the telemetry."""
    return T0 + HOUR_S * np.arange(1, DAYS * 24 + 1, dtype=np.float64)


def fleet(nodes: int = 16, per_rack: int = 4, per_leaf: int = 8, seed: int = 7) -> Telemetry:
    """A healthy fleet: 8 GPUs and 2 ports per node, quiet counters, steady temperatures."""
    rng = np.random.default_rng(seed)
    t = times()
    telemetry = Telemetry(source="test")
    for i in range(nodes):
        node = f"gpu{i + 1:02d}"
        telemetry.labels[node] = {
            "rack": f"r{i // per_rack}",
            "leaf": f"leaf{i // per_leaf}",
            "node_type": "h100",
        }
        for g in range(8):
            telemetry.series[SeriesKey(node, ECC_SBE, gpu=g)] = (t, np.zeros(len(t)))
            telemetry.series[SeriesKey(node, REMAP_CORRECTABLE, gpu=g)] = (t, np.zeros(len(t)))
            temp = 45 + rng.normal(0, 2) + rng.normal(0, 0.3, len(t))
            telemetry.series[SeriesKey(node, GPU_TEMP, gpu=g)] = (t, temp)
        for p in range(2):
            key = SeriesKey(node, IB_SYMBOL, port=f"mlx5_{p}/1")
            telemetry.series[key] = (t, np.zeros(len(t)))
    return telemetry


def set_series(telemetry: Telemetry, key: SeriesKey, values: np.ndarray) -> None:
    """Replace one series' values (same hourly times)."""
    telemetry.series[key] = (times(), np.asarray(values, dtype=np.float64))


def ramp_from(day: float, per_hour_end: float) -> np.ndarray:
    """A counter whose rate grows exponentially from ``day`` to ``per_hour_end`` at the end."""
    t = times()
    frac = np.clip((t - (T0 + day * DAY_S)) / (AT - (T0 + day * DAY_S)), 0, 1)
    rate = np.expm1(frac * np.log1p(per_hour_end))
    return np.cumsum(rate)


def xid(node: str, gpu: int | None, code: int, hours_before: float) -> Event:
    """An Xid event ``hours_before`` the end of the telemetry."""
    return Event(AT - hours_before * HOUR_S, node, "xid", gpu, code)
