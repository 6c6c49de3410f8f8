"""Every real fixture is read by some parser, and the registry is what the CLI offers."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import PARSERS, ParseError, to_jsonable

from ._real import KIND_OF, REAL, of_kind, real_text

EXPECTED_KINDS = {
    "nccl-tests",
    "nvidia-smi-xml",
    "nvidia-smi-q",
    "nvidia-smi-csv",
    "nvidia-smi-topo",
    "nvlink",
    "dcgmi",
    "dcgmi-nvlink",
    "ibstat",
    "ibv_devinfo",
    "ib_write_bw",
    "gpu-burn",
    "xid",
}


def test_registry_has_every_kind() -> None:
    assert set(PARSERS) == EXPECTED_KINDS


def test_every_fixture_file_is_assigned_a_kind() -> None:
    on_disk = {
        str(p.relative_to(REAL))
        for p in REAL.rglob("*")
        if p.is_file() and p.name not in ("README.md", "SOURCES.md")
    }
    assert on_disk == set(KIND_OF)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_every_kind_has_real_samples(kind: str) -> None:
    assert of_kind(kind), f"no real fixture for {kind}"


@pytest.mark.parametrize(("name", "kind"), [(n, k) for n, k in KIND_OF.items() if k])
def test_every_sample_parses_to_json(name: str, kind: str) -> None:
    result = PARSERS[kind](real_text(name))
    data = to_jsonable(result)
    assert isinstance(data, dict)
    assert data  # a real structure, not an empty success


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
@pytest.mark.parametrize("text", ["", "   \n\t\n"])
def test_empty_input_is_refused(kind: str, text: str) -> None:
    with pytest.raises(ParseError, match="empty input"):
        PARSERS[kind](text)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_garbage_is_refused_naming_the_problem(kind: str) -> None:
    with pytest.raises(ParseError) as caught:
        PARSERS[kind]("hello world\nthis is not tool output\n")
    assert str(caught.value)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("nccl-tests", "ib/superbench-ib_write_bw-loopback-8M.txt"),
        ("ibstat", "ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt"),
        ("ibv_devinfo", "ib/gpud-ibstat-a100-node-mt4126-200.txt"),
        ("ib_write_bw", "nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt"),
        ("nvidia-smi-q", "nvidia-smi/mleng-h100-8gpu-topo-m.txt"),
        ("nvidia-smi-xml", "nvidia-smi/gpud-h100-8gpu-q-535.161.08.txt"),
        ("nvidia-smi-topo", "nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt"),
        ("nvlink", "nvidia-smi/mleng-h100-8gpu-topo-m.txt"),
        ("dcgmi", "ib/gpud-ibstat-a100-node-mt4126-200.txt"),
        ("dcgmi-nvlink", "dcgmi/gcm-dcgmi-nvlink-e-g0-head9.txt"),
        ("gpu-burn", "kernel/gpud-dmesg-decode-iso-xid13-xid43.txt"),
        ("xid", "kernel/superbench-a100-80gb-8gpu-gpu_burn.txt"),
        ("nvidia-smi-csv", "nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt"),
    ],
)
def test_other_tools_output_is_refused(kind: str, name: str) -> None:
    with pytest.raises(ParseError):
        PARSERS[kind](real_text(name))
