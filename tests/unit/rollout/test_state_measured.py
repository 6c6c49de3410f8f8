"""Admitted nodes' last measured values, read back from the store for peer comparisons."""

from __future__ import annotations

from pathlib import Path

from gpuforge.rollout.state import ResultRow, open_store


def _row(host: str, check: str, measured: str) -> ResultRow:
    return ResultRow(host, check, "pass", measured, "", "", 0.0)


def test_latest_measured_keeps_the_last_numeric_value(tmp_path: Path) -> None:
    store = open_store(tmp_path / "rollout.db")
    first = store.start_run(1, "burnin", "op")
    store.record_results(
        first,
        [
            _row("gpu05", "burnin.gpu_burn.min_gflops", "52000.0"),
            _row("gpu06", "burnin.gpu_burn.min_gflops", "51800.5"),
            _row("gpu06", "gpu.count", "8"),
        ],
    )
    later = store.start_run(1, "burnin", "op")
    store.record_results(
        later,
        [
            _row("gpu05", "burnin.gpu_burn.min_gflops", "52500.0"),
            _row("gpu07", "burnin.gpu_burn.min_gflops", "hung"),
        ],
    )
    got = store.latest_measured(
        ["gpu05", "gpu06", "gpu07", "gpu99"], ["burnin.gpu_burn.min_gflops"]
    )
    assert got == {"burnin.gpu_burn.min_gflops": {"gpu05": 52500.0, "gpu06": 51800.5}}
    assert store.latest_measured([], ["burnin.gpu_burn.min_gflops"]) == {}
