"""Parsers notice a cut capture and refuse another tool's output (real captures, cut here)."""

from __future__ import annotations

import pytest

from gpuforge.command import CommandResult
from gpuforge.validate import nccl
from gpuforge.validate.parsers import (
    ParseError,
    dcgmi,
    dcgmi_nvlink,
    ib_write_bw,
    ibv_devinfo,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvlink,
)
from gpuforge.validate.result import Status

from ._real import real_text

IBV = "ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt"
DCGMI_NVLINK = "dcgmi/gcm-8gpu-12link-dcgmi-nvlink-s.txt"
NVLINK = "nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt"
NVLINK_8GPU = "nvidia-smi/gpud-a100-80gb-8gpu-nvlink-status.txt"
TOPO = "nvidia-smi/nge-h200-topo-m.txt"
NCCL = "nccl-tests/superbench-a100-40gb-8gpu-all_reduce_perf.txt"


def _cut_after(text: str, marker: str, occurrence: int = 1, extra_lines: int = 0) -> str:
    """``text`` up to the line holding the ``occurrence``-th ``marker``, plus ``extra_lines``."""
    lines = text.splitlines(keepends=True)
    seen = 0
    for i, line in enumerate(lines):
        if marker in line:
            seen += 1
            if seen == occurrence:
                return "".join(lines[: i + 1 + extra_lines])
    raise AssertionError(f"{marker!r} #{occurrence} not in the fixture")


def test_whole_captures_have_no_cut_warning() -> None:
    assert not any("cut" in w for w in ibv_devinfo.parse(real_text(IBV)).warnings)
    assert not dcgmi_nvlink.parse(real_text(DCGMI_NVLINK)).warnings
    assert not nvlink.parse(real_text(NVLINK)).warnings
    assert not nvlink.parse(real_text(NVLINK_8GPU)).warnings
    assert not nvidia_smi_topo.parse(real_text(TOPO)).warnings


@pytest.mark.parametrize(
    ("marker", "extra"),
    [("hca_id", 4), ("hca_id", 12), ("state:", 0)],
    ids=["inside-hca-fields", "inside-port", "after-port-state"],
)
def test_ibv_devinfo_cut_inside_the_seventh_hca_warns(marker: str, extra: int) -> None:
    text = _cut_after(real_text(IBV), marker, 7, extra)
    result = ibv_devinfo.parse(text)
    assert len(result.hcas) == 7
    assert any("the output is cut" in w for w in result.warnings), result.warnings


@pytest.mark.parametrize(
    ("marker", "occurrence", "extra", "expected"),
    [
        ("gpuId", 6, 1, "no 'NvSwitches:' section"),
        ("gpuId", 6, 0, "has no link states"),
        ("NvSwitches:", 1, 1, "no 'Key:' line"),
    ],
)
def test_dcgmi_nvlink_cut_warns(marker: str, occurrence: int, extra: int, expected: str) -> None:
    text = _cut_after(real_text(DCGMI_NVLINK), marker, occurrence, extra)
    assert any(expected in w for w in dcgmi_nvlink.parse(text).warnings)


def test_dcgmi_nvlink_row_cut_midway_warns() -> None:
    text = _cut_after(real_text(DCGMI_NVLINK), "gpuId 3", 1, 1).rstrip("\n")[:-8] + "\n"
    warnings = dcgmi_nvlink.parse(text).warnings
    assert any("gpu 3 lists 8 links, others 12" in w for w in warnings), warnings


def test_nvidia_smi_nvlink_cut_inside_the_last_gpu_warns() -> None:
    text = _cut_after(real_text(NVLINK_8GPU), "GPU 5:", 1, 7)
    warnings = nvlink.parse(text).warnings
    assert any("GPU 5 lists 7 links, others 12" in w for w in warnings), warnings


def test_topo_legend_cut_warns() -> None:
    text = _cut_after(real_text(TOPO), "PHB  =")
    warnings = nvidia_smi_topo.parse(text).warnings
    assert any("lacks PXB, PIX, NV#" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("parse", "fixture", "tool"),
    [
        (
            dcgmi.parse,
            "nvidia-smi/aznhc-a100-80gb-nvlink-status-all-links-inactive.txt",
            "nvidia-smi nvlink",
        ),
        (dcgmi.parse, DCGMI_NVLINK, "dcgmi nvlink"),
        (dcgmi_nvlink.parse, NVLINK, "nvidia-smi nvlink"),
        (nvidia_smi_q.parse, NVLINK, "nvidia-smi nvlink"),
        (nvidia_smi_q.parse, DCGMI_NVLINK, "dcgmi nvlink"),
        (nvlink.parse, "nvidia-smi/nge-h200-q-load.txt", "nvidia-smi -q"),
        (ibv_devinfo.parse, "ib/gpud-ibstat-a100-node-mt4126-200.txt", "ibstat"),
        (nvidia_smi_topo.parse, NVLINK, "nvidia-smi nvlink"),
    ],
)
def test_another_tools_capture_is_refused(parse: object, fixture: str, tool: str) -> None:
    with pytest.raises(ParseError, match=f"this is '{tool}"):
        parse(real_text(fixture))  # type: ignore[operator]


def test_single_node_nccl_without_the_average_line_does_not_pass() -> None:
    whole = real_text(NCCL)
    cut = _cut_after(whole, "# Out of bounds values")
    assert "# Avg bus bandwidth" in whole and "# Avg bus bandwidth" not in cut
    assert (
        nccl.judge_single_node("n", CommandResult("n", "x", 0, whole), 199.8, gpus=8).status
        is Status.PASS
    )
    judged = nccl.judge_single_node("n", CommandResult("n", "x", 0, cut), 199.8, gpus=8)
    assert judged.status is Status.ERROR
    assert "Avg bus bandwidth" in judged.message


def test_a_parse_error_quoting_a_huge_line_stays_short() -> None:
    """Found by the fuzz test: ib_write_bw quoted a 6,600-character CSV header whole."""
    text = real_text("nvidia-smi/nge-h100-80gb-hbm3-query-gpu-csv-load.txt")
    with pytest.raises(ParseError) as caught:
        ib_write_bw.parse(text)
    assert len(str(caught.value)) < 400
