"""nccl-tests: every real sample, both column layouts, srun/mpirun prefixes, cut logs."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import ParseError, nccl_tests

from ._real import real_text

# file, layout, rows, avg busbw, GPUs (rank lines), hosts, last row's out-of-place busbw
FACTS = [
    ("a3mega-h100-2node-16gpu-all_reduce_perf.txt", "new", 31, 70.742, 16, 2, 338.82),
    (
        "awsome-p4de-a100-2node-efa-all_reduce_perf-srun-prefixed-excerpt.txt",
        "new",
        29,
        None,
        0,
        0,
        78.33,
    ),
    (
        "awsome-p5-h100-2node-efa-all_reduce_perf-srun-prefixed-excerpt.txt",
        "new",
        32,
        None,
        0,
        0,
        487.09,
    ),
    ("azh200doc-h200-8gpu-all_reduce_perf-8G-single-size.txt", "new", 1, 476.967, 8, 1, 476.96),
    ("coreweave-h100-64gpu-sharp-all_reduce_perf-excerpt.txt", "new", 5, 373.187, 0, 0, 386.56),
    ("deepops-dgxa100-2node-hdr-all_reduce_perf-old-format.txt", "old", 30, 53.7098, 0, 0, 188.53),
    ("deepops-roce-2node-all_reduce_perf-old-format-low-bw.txt", "old", 29, 7.76739, 0, 0, None),
    ("ocihowto-h200-2node-16gpu-all_reduce_perf.txt", "new", 5, 476.572, 16, 2, 486.49),
    ("superbench-a100-40gb-8gpu-all_gather_perf.txt", "old", 34, 58.2651, 8, 1, 223.39),
    ("superbench-a100-40gb-8gpu-all_reduce_perf.txt", "old", 34, 68.4048, 8, 1, 235.26),
    ("superbench-a100-40gb-8gpu-alltoall_perf.txt", "old", 34, 58.6481, 8, 1, 224.31),
]
IDS = [f[0] for f in FACTS]


def _parse(name: str) -> nccl_tests.NcclTestsResult:
    return nccl_tests.parse(real_text(f"nccl-tests/{name}"))


@pytest.mark.parametrize(("name", "layout"), [(f[0], f[1]) for f in FACTS], ids=IDS)
def test_layout(name: str, layout: str) -> None:
    assert _parse(name).layout == layout


@pytest.mark.parametrize(("name", "rows"), [(f[0], f[2]) for f in FACTS], ids=IDS)
def test_every_row_is_read(name: str, rows: int) -> None:
    assert len(_parse(name).rows) == rows


@pytest.mark.parametrize(("name", "avg"), [(f[0], f[3]) for f in FACTS], ids=IDS)
def test_avg_bus_bandwidth(name: str, avg: float | None) -> None:
    assert _parse(name).avg_busbw_gbps == avg


@pytest.mark.parametrize(("name", "gpus", "hosts"), [(f[0], f[4], f[5]) for f in FACTS], ids=IDS)
def test_gpus_and_hosts_that_took_part(name: str, gpus: int, hosts: int) -> None:
    result = _parse(name)
    assert result.gpu_count == gpus
    assert len(result.hosts) == hosts


@pytest.mark.parametrize(("name", "busbw"), [(f[0], f[6]) for f in FACTS if f[6]], ids=str)
def test_largest_size_busbw(name: str, busbw: float) -> None:
    assert _parse(name).rows[-1].out_of_place.busbw_gbps == busbw


@pytest.mark.parametrize("name", IDS)
def test_no_wrong_results_in_healthy_runs(name: str) -> None:
    result = _parse(name)
    assert result.wrong_total == 0
    assert result.out_of_bounds in (0, None)


def test_rank_lines_name_host_device_bus_and_model() -> None:
    rank = _parse("a3mega-h100-2node-16gpu-all_reduce_perf.txt").ranks[8]
    assert (rank.rank, rank.group, rank.pid, rank.host, rank.device) == (
        8,
        0,
        6733,
        "ztan-mig-gq73",
        0,
    )
    assert rank.bus_id == "0000:04:00"
    assert rank.gpu_name == "NVIDIA H100 80GB HBM3"


def test_old_layout_rank_lines_without_group() -> None:
    ranks = _parse("superbench-a100-40gb-8gpu-all_reduce_perf.txt").ranks
    assert [r.group for r in ranks] == [None] * 8
    assert {r.gpu_name for r in ranks} == {"A100-SXM4-40GB"}


def test_old_layout_error_column_is_a_float() -> None:
    row = _parse("deepops-dgxa100-2node-hdr-all_reduce_perf-old-format.txt").rows[0]
    assert row.out_of_place.error == pytest.approx(2e-7)
    assert row.out_of_place.wrong is None


def test_old_layout_na_error_is_none() -> None:
    row = _parse("superbench-a100-40gb-8gpu-all_reduce_perf.txt").rows[0]
    assert row.out_of_place.error is None


def test_alltoall_blank_redop_is_none() -> None:
    row = _parse("superbench-a100-40gb-8gpu-alltoall_perf.txt").rows[-1]
    assert row.redop is None
    assert row.in_place.busbw_gbps == 226.16


def test_in_place_values() -> None:
    row = _parse("a3mega-h100-2node-16gpu-all_reduce_perf.txt").rows[-1]
    assert (row.size_bytes, row.count, row.dtype, row.redop, row.root) == (
        8589934592,
        2147483648,
        "float",
        "sum",
        -1,
    )
    assert (row.in_place.time_us, row.in_place.algbw_gbps, row.in_place.busbw_gbps) == (
        47743.0,
        179.92,
        337.35,
    )


def test_nccl_version_and_params() -> None:
    result = _parse("ocihowto-h200-2node-16gpu-all_reduce_perf.txt")
    assert result.nccl_version == "2.27.5+cuda12.8"
    assert result.params["maxBytes"] == "17179869184"
    assert result.params["iters"] == "50"


def test_interleaved_nccl_info_line_is_skipped() -> None:
    result = _parse("superbench-a100-40gb-8gpu-all_reduce_perf.txt")
    assert result.rows[0].line == 17  # line 16 is "hostname:3442:3442 [0] NCCL INFO ..."


def test_srun_excerpt_says_what_is_missing() -> None:
    warnings = _parse("awsome-p5-h100-2node-efa-all_reduce_perf-srun-prefixed-excerpt.txt").warnings
    assert any("Rank" in w for w in warnings)
    assert any("Avg bus bandwidth" in w for w in warnings)


def test_author_elision_is_reported() -> None:
    warnings = _parse("coreweave-h100-64gpu-sharp-all_reduce_perf-excerpt.txt").warnings
    assert any(w.startswith("line 3: elision") for w in warnings)


def test_complete_run_has_no_warnings() -> None:
    assert _parse("a3mega-h100-2node-16gpu-all_reduce_perf.txt").warnings == ()


def test_mpirun_tag_output_prefix() -> None:
    text = real_text("nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt")
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in text.splitlines())
    result = nccl_tests.parse(tagged)
    assert result.avg_busbw_gbps == 70.742
    assert result.gpu_count == 16


def test_wrong_results_and_out_of_bounds_are_counted() -> None:
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong\n"
        "     1048576        262144     float     sum      -1    203.2    5.16    9.68      3"
        "    207.2    5.06    9.49      0\n"
        "# Out of bounds values : 3 FAILED\n"
        "# Avg bus bandwidth    : 9.58\n"
    )
    result = nccl_tests.parse(text)
    assert result.wrong_total == 3
    assert result.out_of_bounds == 3
    assert result.out_of_bounds_ok is False


def test_table_without_rows_is_refused() -> None:
    text = "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
    with pytest.raises(ParseError, match="no result rows"):
        nccl_tests.parse(text)


def test_cut_row_names_its_line() -> None:
    text = real_text("nccl-tests/ocihowto-h200-2node-16gpu-all_reduce_perf.txt")
    lines = text.splitlines()
    lines[24] = lines[24][:40]
    with pytest.raises(ParseError) as caught:
        nccl_tests.parse("\n".join(lines))
    assert caught.value.line == 25
    assert "line 25" in str(caught.value)
