"""``dcgmi diag`` (table and ``-j`` JSON) and ``dcgmi nvlink -s``."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import ParseError, dcgmi, dcgmi_nvlink

from ._real import real_text


def _diag(name: str) -> dcgmi.DcgmDiag:
    return dcgmi.parse(real_text(f"dcgmi/{name}"))


def _test(result: dcgmi.DcgmDiag, name: str) -> dcgmi.DiagTest:
    return next(t for t in result.tests if t.name == name)


META = [
    ("awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt", "3.3.3", "535.104.12", 8, 11),
    ("azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt", "3.1.8", "550.127.08", 8, 9),
    (
        "idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt",
        "3.3.9",
        "570.195.03",
        4,
        16,
    ),
]


@pytest.mark.parametrize(("name", "version", "driver", "gpus", "tests"), META)
def test_diag_metadata(name: str, version: str, driver: str, gpus: int, tests: int) -> None:
    result = _diag(name)
    assert result.format == "table"
    assert result.dcgm_version == version
    assert result.driver_version == driver
    assert len(result.gpu_device_ids) == gpus
    assert len(result.tests) == tests


def test_diag_all_pass() -> None:
    result = _diag("awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt")
    assert result.failed == ()
    memory = _test(result, "GPU Memory")
    assert memory.category == "Hardware"
    assert [r.gpu for r in memory.results] == list(range(8))  # "Pass - All" on 8 GPUs
    assert result.warnings == ()


def test_diag_persistence_fail_with_wrapped_error() -> None:
    result = _diag("azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt")
    persistence = _test(result, "Persistence Mode")
    assert persistence.status == "Fail"
    assert [t.name for t in result.failed] == ["Persistence Mode"]
    (error,) = persistence.errors
    assert error.startswith("Persistence mode for GPU 0 is currently disabled. The DCGM")
    assert "GPU 1 is currently disabled" in error  # "currently" + " disabled" rejoined
    assert error.endswith("requires peristence mod")  # dcgmi itself cut the cell


def test_diag_targeted_power_per_gpu() -> None:
    result = _diag("idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt")
    power = _test(result, "Targeted Power")
    assert power.status == "Fail"
    assert {r.gpu: r.status for r in power.results} == {0: "Pass", 2: "Pass", 3: "Pass", 1: "Fail"}
    assert power.warnings == (
        "GPU 1 Max power of 224.1 did not reach desired power minimum target_power_min_ratio of "
        "224.2 for GPU 1 Verify that the clock speeds and GPU utilization are high.",
    )
    assert len(power.info) == 3


def test_diag_skip_all() -> None:
    result = _diag("idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt")
    eud = _test(result, "EUD Test")
    assert eud.status == "Skip"
    assert [r.gpu for r in eud.results] == [0, 1, 2, 3]


def test_diag_excerpt_error_without_test() -> None:
    result = _diag("mleng-dcgmi-diag-r3-row-remap-pending-excerpt.txt")
    assert result.errors == (
        "GPU 3 has uncorrectable memory errors and row remappings are pending",
    )
    assert result.tests == ()
    assert any("not closed" in w for w in result.warnings)


def test_diag_tool_error_without_table() -> None:
    result = _diag("dcgm-issue94-a100-80gb-pcie-mig-incompatible-error.txt")
    assert not result.completed
    assert result.format == "text"
    assert result.tests == ()
    assert any("Return: (-35)" in e for e in result.errors)
    assert any("MIG configuration is incompatible" in e for e in result.errors)


def test_diag_json() -> None:
    result = _diag("virtualclient-t4-dcgmi-diag-r3-j.json.txt")
    assert result.format == "json"
    assert len(result.tests) == 16
    assert result.failed == ()
    assert _test(result, "EUD Test").status == "Skip"
    memory = _test(result, "GPU Memory")
    assert memory.results == (dcgmi.DiagGpuResult(gpu=0, status="Pass"),)
    assert memory.info == ("GPU 0 Allocated 15206918958 bytes (97.3%)",)


def test_diag_json_bad_status_is_refused() -> None:
    text = real_text("dcgmi/virtualclient-t4-dcgmi-diag-r3-j.json.txt").replace(
        '"status" : "Pass"', '"status" : "Maybe"', 1
    )
    with pytest.raises(ParseError, match="Maybe"):
        dcgmi.parse(text)


def test_diag_json_broken_names_its_line() -> None:
    with pytest.raises(ParseError, match="not valid JSON") as caught:
        dcgmi.parse('{\n"DCGM GPU Diagnostic" :\n')
    assert caught.value.line == 3


def test_diag_unknown_result_names_its_line() -> None:
    text = real_text("dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt").replace(
        "| Inforom                   | Pass ", "| Inforom                   | Okay ", 1
    )
    with pytest.raises(ParseError, match="not Pass/Fail/Skip/Warn") as caught:
        dcgmi.parse(text)
    assert caught.value.line == 18


# dcgmi nvlink -s ----------------------------------------------------------------------------


def test_dcgmi_nvlink_all_up() -> None:
    status = dcgmi_nvlink.parse(real_text("dcgmi/gcm-8gpu-12link-dcgmi-nvlink-s.txt"))
    assert [g.id for g in status.gpus] == list(range(8))
    assert {g.up for g in status.gpus} == {12}
    assert status.nvswitches == ()


def test_dcgmi_nvlink_all_down() -> None:
    status = dcgmi_nvlink.parse(
        real_text("dcgmi/dcgm-issue198-h100nvl-2gpu-nvlink-link-status-all-down.txt")
    )
    assert len(status.gpus) == 2
    assert {g.up for g in status.gpus} == {0}
    assert status.gpus[1].states == ("down",) * 18


def test_dcgmi_nvlink_error_counts_are_refused() -> None:
    with pytest.raises(ParseError, match="nvlink -e"):
        dcgmi_nvlink.parse(real_text("dcgmi/gcm-dcgmi-nvlink-e-g0-head9.txt"))
