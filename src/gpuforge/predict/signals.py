"""Per-series features over a look-back window, computed on ``(series x samples)`` arrays.

The window ``[at - length, at]`` is cut into :attr:`Window.bins` equal bins (seven days of one
day each by default). For a counter (a Prometheus ``counter``: ECC errors, PCIe replays, IB symbol
errors) a feature row holds the increments per bin (a decrease is a counter reset: the new value
is the increment, as Prometheus' ``increase()`` reads it); for a gauge (temperature, clocks) the
mean per bin. The trend is the Theil-Sen slope over the bins: the median of the pairwise slopes,
so one burst in one bin moves it little, while a rate that keeps rising moves it a lot.
"""

from __future__ import annotations

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


def gauge_features(t: FloatArray, x: FloatArray, window: Window) -> Features:
    """Mean per bin of gauges ``x`` (k x len(t)) sampled at ``t`` (sorted)."""
    lo, hi = _window_slice(t, window)
    k = x.shape[0]
    if hi - lo < 1:
        return _empty(x, t, window, lo=lo, hi=hi)
    tw = t[lo:hi]
    xw = x[:, lo:hi]
    edges = _bin_edges(tw, window)
    cum = np.zeros((k, xw.shape[1] + 1))
    np.cumsum(xw, axis=1, out=cum[:, 1:])
    counts = (edges[1:] - edges[:-1]).astype(np.float64)
    sums = cum[:, edges[1:]] - cum[:, edges[:-1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        bins = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), np.nan)
    return Features(
        bins=bins,
        slope=theil_sen(bins),
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
