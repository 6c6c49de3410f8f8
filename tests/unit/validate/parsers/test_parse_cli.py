"""``gpuforge parse KIND FILE``: tables, JSON, stdin, and exit 2 naming the broken line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuforge.cli import main

from ._real import KIND_OF, REAL, real_text


def _run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["parse", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def _path(relative: str) -> str:
    real_text(relative)  # skips when the fixture tree is absent
    return str(REAL / relative)


def test_nccl_tests_text_shows_rows_average_and_hosts() -> None:
    code, out, _ = _run(
        "nccl-tests", _path("nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt")
    )
    assert code == 0
    assert "avg_busbw_gbps: 70.742" in out
    assert "out_of_bounds: 0" in out
    assert "hosts: ztan-mig-235z, ztan-mig-gq73" in out
    assert "ranks (16):" in out
    assert "rows (31):" in out
    assert "8589934592" in out
    assert "NVIDIA H100 80GB HBM3" in out


def test_nccl_tests_json() -> None:
    code, out, _ = _run(
        "nccl-tests", _path("nccl-tests/ocihowto-h200-2node-16gpu-all_reduce_perf.txt"), "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["avg_busbw_gbps"] == 476.572
    assert len(data["rows"]) == 5
    assert data["rows"][-1]["out_of_place"]["busbw_gbps"] == 486.49
    assert data["hosts"] == ["GPU-6550", "GPU-3841"]


def test_stdin_dash() -> None:
    text = real_text("ib/gpud-ibstat-h100-node-cx7-ndr400-ib-cx6dx-ports-down.txt")
    code, out, _ = _run("ibstat", "-", "--json", stdin=text)
    assert code == 0
    data = json.loads(out)
    assert [ca["ports"][0]["state"] for ca in data["cas"]].count("Down") == 3


def test_warnings_are_printed() -> None:
    code, out, _ = _run(
        "nvidia-smi-q", _path("nvidia-smi/gpud-h100-q-535.183.01-truncated-invalid-keys.txt")
    )
    assert code == 0
    assert "warnings:" in out
    assert "the output is cut" in out


def test_unreadable_file_exits_2_naming_the_line() -> None:
    code, _, err = _run("ibstat", _path("nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt"))
    assert code == 2
    assert "cannot read as ibstat: line 1:" in err


def test_garbage_on_stdin_exits_2() -> None:
    code, _, err = _run("dcgmi", "-", stdin="hello\n")
    assert code == 2
    assert "<stdin>" in err


def test_missing_file_exits_2() -> None:
    code, _, err = _run("xid", "/nonexistent/dmesg.txt")
    assert code == 2
    assert "cannot read" in err


def test_unknown_kind_is_a_usage_error() -> None:
    code, _, _ = _run("nvidia-smi-html", "-", stdin="x")
    assert code == 2


def test_csv_fields_option_for_noheader() -> None:
    code, out, _ = _run(
        "nvidia-smi-csv",
        "-",
        "--fields",
        "index,name,memory.total",
        "--json",
        stdin="0, NVIDIA H200, 143771 MiB\n",
    )
    assert code == 0
    assert json.loads(out)["rows"][0]["values"]["name"] == "NVIDIA H200"


def test_fields_option_refused_for_other_kinds() -> None:
    code, _, _ = _run("xid", "-", "--fields", "a", stdin="[ 1.0] NVRM: hello\n")
    assert code == 2


@pytest.mark.parametrize(
    ("kind", "relative", "expected"),
    [
        ("ib_write_bw", "ib/superbench-ib_write_bw-loopback-8M.txt", "24056.7"),
        ("gpu-burn", "kernel/gpuburn-issue12-16gpu-faulty-summary.txt", "FAULTY"),
        ("xid", "kernel/mleng-a100-xid63-row-remapper.txt", "Row Remapper"),
        ("dcgmi", "dcgmi/azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt", "Fail"),
        ("nvidia-smi-topo", "nvidia-smi/mleng-h100-8gpu-topo-m.txt", "NV18"),
        ("nvlink", "nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt", "26.562"),
        ("nvidia-smi-xml", "nvidia-smi/telegraf-a100-sxm4-80gb-mig-q-x.xml.txt", "535.54.03"),
        ("ibv_devinfo", "ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt", "mlx5_an0"),
        ("dcgmi-nvlink", "dcgmi/gcm-8gpu-12link-dcgmi-nvlink-s.txt", "up"),
    ],
)
def test_each_kind_prints_its_values(kind: str, relative: str, expected: str) -> None:
    code, out, _ = _run(kind, _path(relative))
    assert code == 0
    assert expected in out


@pytest.mark.parametrize(("relative", "kind"), [(n, k) for n, k in KIND_OF.items() if k])
def test_every_real_sample_prints_as_text(relative: str, kind: str) -> None:
    code, out, err = _run(kind, _path(relative))
    assert (code, err) == (0, "")
    assert out.startswith(f"{kind}: ")
    assert len(out.splitlines()) > 2
