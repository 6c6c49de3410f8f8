"""Per-series features over a look-back window, computed on ``(series x samples)`` arrays.

The window ``[at - length, at]`` is cut into :attr:`Window.bins` equal bins (seven days of one
day each by default). For a counter (a Prometheus ``counter``: ECC errors, PCIe replays, IB symbol
errors) a feature row holds the increments per bin (a decrease is a counter reset: the new value
is the increment, as Prometheus' ``increase()`` reads it); for a gauge (temperature, clocks) the
mean per bin. The trend is the Theil-Sen slope over the bins: the median of the pairwise slopes,
so one burst in one bin moves it little, while a rate that keeps rising moves it a lot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True)
class Window:
    """The look-back window that ends at ``at`` (epoch seconds), in ``bins`` equal parts."""

    at: float
    length: float = 7 * DAY_S
    bins: int = 7

    @property
    def start(self) -> float:
        """Where the window begins."""
        return self.at - self.length

    @property
    def bin_s(self) -> float:
        """Seconds per bin."""
        return self.length / self.bins


@dataclass(frozen=True)
class Features:
    """Features of ``k`` series that share one time axis (one row per series)."""

    bins: FloatArray  # (k, bins): increments (counter) or means (gauge); NaN: no sample
    slope: FloatArray  # (k,): Theil-Sen slope over the bins, per bin
    first: FloatArray  # (k,): first value in the window
    last: FloatArray  # (k,): last value in the window
    coverage: float  # fraction of the window the samples span
    samples: int  # samples in the window
    last_time: float  # time of the last sample in the window (NaN when none)


def _bin_edges(t: FloatArray, window: Window) -> npt.NDArray[np.intp]:
    """Indices into ``t`` where each bin starts, and the end (``bins + 1`` values)."""
    cuts = window.start + window.bin_s * np.arange(window.bins + 1, dtype=np.float64)
    edges = np.searchsorted(t, cuts, side="left")
    edges[-1] = np.searchsorted(t, window.at, side="right")
    return edges


def nanmedian_rows(values: FloatArray) -> FloatArray:
    """Median of each row ignoring NaN; NaN for a row with no number (and no warning)."""
    if values.shape[1] == 0:
        return np.full(values.shape[0], np.nan)
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = np.sum(~np.isnan(ordered), axis=1)
    low = np.clip((count - 1) // 2, 0, None)
    high = np.clip(count // 2, 0, None)
    lo = np.take_along_axis(ordered, low[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, high[:, None], axis=1)[:, 0]
    out: FloatArray = np.where(count > 0, (lo + hi) / 2.0, np.nan)
    return out


def theil_sen(bins: FloatArray) -> FloatArray:
    """Theil-Sen slope (per bin) of each row of ``bins``, skipping empty bins."""
    n = bins.shape[1]
    i, j = np.triu_indices(n, k=1)
    pairs = (bins[:, j] - bins[:, i]) / (j - i).astype(np.float64)
    return nanmedian_rows(pairs)


def _window_slice(t: FloatArray, window: Window) -> tuple[int, int]:
    lo = int(np.searchsorted(t, window.start, side="left"))
    hi = int(np.searchsorted(t, window.at, side="right"))
    return lo, hi


def counter_features(t: FloatArray, x: FloatArray, window: Window) -> Features:
    """Increments per bin of counters ``x`` (k x len(t)) sampled at ``t`` (sorted)."""
    lo, hi = _window_slice(t, window)
    k = x.shape[0]
    if hi - lo < 2:
        return _empty(x, t, window, lo=lo, hi=hi)
    tw = t[lo:hi]
    xw = x[:, lo:hi]
    d = np.diff(xw, axis=1)
    reset = d < 0
    if bool(reset.any()):
        d = np.where(reset, xw[:, 1:], d)
    # each increment belongs to the bin of the later of its two samples
    edges = _bin_edges(tw[1:], window)
    cum = np.zeros((k, d.shape[1] + 1))
    np.cumsum(d, axis=1, out=cum[:, 1:])
    bins = cum[:, edges[1:]] - cum[:, edges[:-1]]
    return Features(
        bins=bins,
        slope=theil_sen(bins),
        first=xw[:, 0].astype(np.float64),
        last=xw[:, -1].astype(np.float64),
        coverage=float(tw[-1] - tw[0]) / window.length,
        samples=hi - lo,
        last_time=float(tw[-1]),
    )


def gauge_features(
    t: FloatArray, x: FloatArray, window: Window, *, nan_aware: bool = False, slope: bool = True
) -> Features:
    """Mean per bin of gauges ``x`` (k x len(t)) sampled at ``t`` (sorted).

    ``nan_aware``: NaN marks a sample left out (a GPU idle when only loaded samples count).
    """
    lo, hi = _window_slice(t, window)
    k = x.shape[0]
    if hi - lo < 1:
        return _empty(x, t, window, lo=lo, hi=hi)
    tw = t[lo:hi]
    xw = x[:, lo:hi]
    edges = _bin_edges(tw, window)
    cum = np.zeros((k, xw.shape[1] + 1))
    if nan_aware:
        valid = np.isfinite(xw)
        np.cumsum(np.where(valid, xw, 0.0), axis=1, out=cum[:, 1:])
        seen = np.zeros((k, xw.shape[1] + 1))
        np.cumsum(valid, axis=1, out=seen[:, 1:])
        counts = seen[:, edges[1:]] - seen[:, edges[:-1]]
    else:
        np.cumsum(xw, axis=1, out=cum[:, 1:])
        counts = np.broadcast_to((edges[1:] - edges[:-1]).astype(np.float64), (k, window.bins))
    sums = cum[:, edges[1:]] - cum[:, edges[:-1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        bins = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), np.nan)
    return Features(
        bins=bins,
        slope=theil_sen(bins) if slope else np.full(k, np.nan),
        first=xw[:, 0].astype(np.float64),
        last=xw[:, -1].astype(np.float64),
        coverage=float(tw[-1] - tw[0]) / window.length,
        samples=hi - lo,
        last_time=float(tw[-1]),
    )


def level_features(t: FloatArray, x: FloatArray, window: Window) -> Features:
    """Only the first and last value in the window (remap counts, flags): no per-bin work."""
    lo, hi = _window_slice(t, window)
    k = x.shape[0]
    if hi - lo < 1:
        return _empty(x, t, window, lo=lo, hi=hi)
    return Features(
        bins=np.full((k, window.bins), np.nan),
        slope=np.full(k, np.nan),
        first=x[:, lo].astype(np.float64),
        last=x[:, hi - 1].astype(np.float64),
        coverage=float(t[hi - 1] - t[lo]) / window.length,
        samples=hi - lo,
        last_time=float(t[hi - 1]),
    )


def _empty(x: FloatArray, t: FloatArray, window: Window, *, lo: int, hi: int) -> Features:
    k = x.shape[0]
    nan = np.full(k, np.nan)
    last = x[:, hi - 1].astype(np.float64) if hi > lo else nan
    return Features(
        bins=np.full((k, window.bins), np.nan),
        slope=nan,
        first=last,
        last=last,
        coverage=0.0,
        samples=hi - lo,
        last_time=float(t[hi - 1]) if hi > lo else float("nan"),
    )


def robust_scale(values: FloatArray, floor: float) -> tuple[float, float]:
    """Median and MAD-based scale (1.4826 x MAD, at least ``floor``) of the finite values."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return float("nan"), floor
    median = float(np.median(finite))
    mad = float(np.median(np.abs(finite - median)))
    return median, max(1.4826 * mad, floor)


#: Gauges read together per node: a GPU is compared with its node's other GPUs at each sample.
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
JOINT = (GPU_TEMP, SM_CLOCK, GPU_UTIL)
#: Derived per-GPU and per-node series (not exported metrics: a leading underscore).
TEMP_EXCESS = "_temp_excess"  # a GPU's temperature less its node's median GPU, same samples
CLOCK_DEFICIT = "_clock_deficit"  # a GPU's SM clock less its node's median GPU, loaded samples
TEMP_LOADED = "_temp_loaded"  # the node's median GPU temperature at loaded samples
#: Utilisation (percent) from which a GPU counts as loaded.
BUSY_UTIL = 50.0
#: Without utilisation: a sample whose node median clock is below this share of its usual
#: loaded clock is an idle one.
IDLE_CLOCK_SHARE = 0.7

Pending = dict[str, list[tuple[list[str], FloatArray, FloatArray]]]


def _gpu_order(subject: str) -> tuple[int, str]:
    tail = subject[3:]
    return (
        (int(tail), subject) if subject.startswith("gpu") and tail.isdigit() else (1 << 30, subject)
    )


def _stack(
    blocks: Sequence[tuple[list[str], FloatArray, FloatArray]], t0: FloatArray | None
) -> tuple[FloatArray | None, dict[str, FloatArray]]:
    """Rows by subject that share one time axis (``t0``, else the first block's)."""
    rows: dict[str, FloatArray] = {}
    for subjects, t, x in blocks:
        if t0 is None:
            t0 = t
        if len(t) != len(t0) or not np.array_equal(t, t0):
            continue
        for i, subject in enumerate(subjects):
            rows[subject] = np.asarray(x[i], dtype=np.float64)
    return t0, rows


def column_median(x: FloatArray) -> FloatArray:
    """Median of each column of a few rows (a node's GPUs): a sort down the short axis."""
    ordered = np.sort(x, axis=0)
    k = x.shape[0]
    out: FloatArray = ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2.0
    return out


def joint_gauges(pending: Pending) -> dict[str, tuple[list[str], FloatArray, FloatArray]]:
    """One node's GPUs against each other at the same samples (same job, same load).

    A GPU's temperature and SM clock less the median of its node's GPUs at each sample: a load
    change or a warmer inlet moves every GPU of the node and leaves these at zero, a GPU that
    runs hot or cannot hold its clock moves alone. Loaded samples only when the load is known
    (``DCGM_FI_DEV_GPU_UTIL``, else the node's clock against its usual loaded clock). The node's
    median temperature at loaded samples is the rack comparison's input (equal load).
    """
    t_temp, temp = _stack(pending.get(GPU_TEMP, []), None)
    t_clock, clock = _stack(pending.get(SM_CLOCK, []), t_temp)
    if t_temp is None:
        t_temp, temp = t_clock, {}
    t_ref = t_temp
    if t_ref is None:
        return {}
    _, util = _stack(pending.get(GPU_UTIL, []), t_ref)
    out: dict[str, tuple[list[str], FloatArray, FloatArray]] = {}
    busy: npt.NDArray[np.bool_] | None = None
    if util:
        busy = column_median(np.vstack(list(util.values()))) >= BUSY_UTIL
    elif len(clock) >= 1:
        node_clock = column_median(np.vstack(list(clock.values())))
        usual = float(np.percentile(node_clock, 90)) if node_clock.size else 0.0
        busy = node_clock >= IDLE_CLOCK_SHARE * usual
    for name, rows in ((TEMP_EXCESS, temp), (CLOCK_DEFICIT, clock)):
        if len(rows) < 3:
            continue
        subjects = sorted(rows, key=_gpu_order)
        x = np.vstack([rows[s] for s in subjects])
        keep = busy if busy is not None and bool(busy.any()) else np.ones(x.shape[1], bool)
        median = np.full(x.shape[1], np.nan)
        median[keep] = column_median(x[:, keep])
        # the load is the node's (its GPUs run one job): idle samples leave whole columns out
        out[name] = (subjects, t_ref, x - median[None, :])
        if name == TEMP_EXCESS:
            out[TEMP_LOADED] = (["node"], t_ref, median[None, :])
    return out
