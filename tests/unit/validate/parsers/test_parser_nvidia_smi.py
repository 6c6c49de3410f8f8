"""nvidia-smi: ``-q`` text, ``-q -x`` XML, ``--query-gpu`` CSV, ``topo -m``, ``nvlink -s``."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import (
    ParseError,
    nvidia_smi_csv,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvidia_smi_xml,
    nvlink,
)
from gpuforge.validate.parsers.nvidia_smi_common import NvidiaSmiReport

from ._real import real_text


def _q(name: str) -> NvidiaSmiReport:
    return nvidia_smi_q.parse(real_text(f"nvidia-smi/{name}"))


# -q text ------------------------------------------------------------------------------------

Q_FACTS = [
    # file, driver, attached, GPU sections, first bus id, first product
    (
        "gpud-h100-8gpu-q-535.161.08.txt",
        "535.161.08",
        8,
        8,
        "00000000:19:00.0",
        "NVIDIA H100 80GB HBM3",
    ),
    (
        "nge-h100-80gb-hbm3-q-load.txt",
        "590.48.01",
        1,
        1,
        "00000000:00:09.0",
        "NVIDIA H100 80GB HBM3",
    ),
    ("nge-h200-q-load.txt", "590.48.01", 1, 1, "00000000:83:00.0", "NVIDIA H200"),
    ("nge-h100-mig-q-load.txt", "590.48.01", 1, 1, "00000000:00:09.0", "NVIDIA H100 80GB HBM3"),
    (
        "gpud-h100-q-535.183.01-truncated-invalid-keys.txt",
        "535.183.01",
        8,
        1,
        "00000000:53:00.0",
        "NVIDIA H100 80GB HBM3",
    ),
    (
        "mleng-a100-80gb-q-ecc-dram-correctable-remap-pending-excerpt.txt",
        "510.73.08",
        8,
        1,
        "00000000:10:1C.0",
        "NVIDIA A100-SXM4-80GB",
    ),
    ("aznhc-8gpu-q-d-page_retirement-healthy.txt", "535.86.10", 8, 8, "00000001:00:00.0", None),
]
Q_IDS = [f[0] for f in Q_FACTS]


@pytest.mark.parametrize(("name", "driver"), [(f[0], f[1]) for f in Q_FACTS], ids=Q_IDS)
def test_q_driver_version(name: str, driver: str) -> None:
    assert _q(name).driver_version == driver


@pytest.mark.parametrize(
    ("name", "attached", "sections"), [(f[0], f[2], f[3]) for f in Q_FACTS], ids=Q_IDS
)
def test_q_gpu_count(name: str, attached: int, sections: int) -> None:
    report = _q(name)
    assert report.attached_gpus == attached
    assert len(report.gpus) == sections


@pytest.mark.parametrize(
    ("name", "bus", "product"), [(f[0], f[4], f[5]) for f in Q_FACTS], ids=Q_IDS
)
def test_q_first_gpu_identity(name: str, bus: str, product: str | None) -> None:
    gpu = _q(name).gpus[0]
    assert gpu.pci_bus_id == bus
    assert gpu.product_name == product


@pytest.mark.parametrize(
    "name",
    [
        "gpud-h100-8gpu-q-535.161.08.txt",
        "nge-h100-80gb-hbm3-q-load.txt",
        "nge-h200-q-load.txt",
        "nge-h100-mig-q-load.txt",
        "aznhc-8gpu-q-d-page_retirement-healthy.txt",
    ],
)
def test_q_complete_reports_have_no_warnings(name: str) -> None:
    assert _q(name).warnings == ()


def test_q_h100_health_values() -> None:
    gpu = _q("gpud-h100-8gpu-q-535.161.08.txt").gpus[0]
    assert gpu.uuid == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert (gpu.pcie_gen_current, gpu.pcie_width_current) == (5, 16)
    assert gpu.temperature_c == 29.0
    assert gpu.power_draw_w == 67.74
    assert gpu.power_limit_w == 700.0
    assert gpu.memory_total_mib == 81559
    assert gpu.ecc_mode == "Enabled"
    assert gpu.persistence_mode == "Enabled"
    assert gpu.fabric_state == "Completed"
    assert gpu.clocks_event_reasons_active == ("HW Slowdown", "HW Power Brake Slowdown")


def test_q_h100_remapped_rows_histogram() -> None:
    rows = _q("gpud-h100-8gpu-q-535.161.08.txt").gpus[7].remapped_rows
    assert rows is not None
    assert (rows.correctable, rows.uncorrectable, rows.pending) == (0, 0, False)
    assert rows.bank_availability["Max"] == 2560


def test_q_not_available_is_none_not_zero() -> None:
    gpu = _q("gpud-h100-8gpu-q-535.161.08.txt").gpus[0]
    assert gpu.retired_pages_sbe is None  # "Single Bit ECC : N/A" on Hopper


def test_q_new_layout_instantaneous_power() -> None:
    gpu = _q("nge-h100-mig-q-load.txt").gpus[0]
    assert gpu.power_draw_w == 444.72
    assert gpu.mig_mode == "Enabled"
    assert gpu.remapped_rows is None  # "Remapped Rows : N/A" with MIG


def test_q_mig_processes_are_kept_apart() -> None:
    fields = _q("nge-h100-mig-q-load.txt").gpus[0].fields
    assert fields["Processes/Process ID"] == "21180"
    assert fields["Processes/Process ID[2]"] == "21198"
    assert fields["Processes/Process ID[2]/Name"] == "./gpu_burn"


def test_q_dram_correctable_and_pending_remap() -> None:
    gpu = _q("mleng-a100-80gb-q-ecc-dram-correctable-remap-pending-excerpt.txt").gpus[0]
    assert gpu.ecc_aggregate is not None
    assert gpu.ecc_aggregate.dram_correctable == 177
    assert gpu.remapped_rows is not None
    assert gpu.remapped_rows.pending is True
    assert gpu.remapped_rows.correctable == 1
    assert gpu.remapped_rows.bank_availability["High"] == 1


def test_q_excerpt_reports_its_elisions() -> None:
    warnings = _q("mleng-a100-80gb-q-ecc-dram-correctable-remap-pending-excerpt.txt").warnings
    assert any(w.startswith("line 8: elision") for w in warnings)
    assert any("'Attached GPUs' says 8 but 1" in w for w in warnings)


def test_q_sram_uncorrectable_fragment() -> None:
    report = _q("mleng-q-ecc-sram-uncorrectable-excerpt.txt")
    gpu = report.gpus[0]
    assert gpu.pci_bus_id is None
    assert gpu.ecc_volatile is not None
    assert gpu.ecc_volatile.sram_uncorrectable == 1
    assert gpu.ecc_aggregate is not None
    assert gpu.ecc_aggregate.sram_uncorrectable == 5
    assert any("fragment" in w for w in report.warnings)


def test_q_remapped_rows_fragment() -> None:
    gpu = _q("gpud-pr80-remapped-rows-uncorrectable-pending-fragment.txt").gpus[0]
    assert gpu.remapped_rows is not None
    assert gpu.remapped_rows.uncorrectable == 4
    assert gpu.remapped_rows.pending is True


def test_q_page_retirement_query() -> None:
    gpus = _q("aznhc-8gpu-q-d-page_retirement-healthy.txt").gpus
    assert [g.retired_pages_sbe for g in gpus] == [0] * 8
    assert [g.retired_pages_pending for g in gpus] == [False] * 8


def test_q_truncated_output_says_so() -> None:
    warnings = _q("gpud-h100-q-535.183.01-truncated-invalid-keys.txt").warnings
    assert any("line 86" in w and "Invalid HW Slowdown" in w for w in warnings)
    assert any("the output is cut" in w for w in warnings)
    assert any("'Attached GPUs' says 8 but 1" in w for w in warnings)


def test_q_stray_top_level_line_names_its_line() -> None:
    text = real_text("nvidia-smi/nge-h200-q-load.txt") + "\nsomething else entirely\n"
    with pytest.raises(ParseError, match="not an 'nvidia-smi -q' line") as caught:
        nvidia_smi_q.parse(text)
    assert caught.value.line is not None


# -q -x XML ----------------------------------------------------------------------------------

XML = "nvidia-smi/telegraf-a100-sxm4-80gb-mig-q-x.xml.txt"


def test_xml_header_values() -> None:
    report = nvidia_smi_xml.parse(real_text(XML))
    assert report.driver_version == "535.54.03"
    assert report.cuda_version == "12.2"
    assert report.attached_gpus == 4


def test_xml_trimmed_fixture_is_reported() -> None:
    report = nvidia_smi_xml.parse(real_text(XML))
    assert len(report.gpus) == 1
    assert report.warnings == ("<attached_gpus> says 4 but 1 <gpu> element(s) are present",)


def test_xml_gpu_values() -> None:
    gpu = nvidia_smi_xml.parse(real_text(XML)).gpus[0]
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.product_name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.mig_mode == "Enabled"
    assert (gpu.pcie_gen_current, gpu.pcie_width_max) == (4, 16)
    assert gpu.temperature_c == 27.0
    assert gpu.power_draw_w == 67.03
    assert gpu.power_limit_w == 500.0
    assert gpu.ecc_volatile is not None
    assert gpu.ecc_volatile.dram_uncorrectable == 0
    assert gpu.remapped_rows is None  # <remapped_rows>N/A</remapped_rows>


def test_xml_broken_names_its_line() -> None:
    text = real_text(XML).replace("</driver_version>", "</driver>", 1)
    with pytest.raises(ParseError, match="not well-formed XML") as caught:
        nvidia_smi_xml.parse(text)
    assert caught.value.line == 5


def test_xml_other_root_is_refused() -> None:
    with pytest.raises(ParseError, match="not <nvidia_smi_log>"):
        nvidia_smi_xml.parse("<html><body/></html>")


# --query-gpu CSV ----------------------------------------------------------------------------

CSV_FACTS = [
    ("nge-h100-80gb-hbm3-query-gpu-csv-load.txt", "NVIDIA H100 80GB HBM3", 81559.0, 59.0),
    ("nge-h200-query-gpu-csv-load.txt", "NVIDIA H200", 143771.0, 52.0),
]


@pytest.mark.parametrize(("name", "product", "memory", "temp"), CSV_FACTS)
def test_csv_values(name: str, product: str, memory: float, temp: float) -> None:
    result = nvidia_smi_csv.parse(real_text(f"nvidia-smi/{name}"))
    row = result.rows[0]
    assert len(result.rows) == 1
    assert result.had_header
    assert row.value("name") == product
    assert row.value("driver_version") == "590.48.01"
    assert row.number("memory.total") == memory
    assert row.number("temperature.gpu") == temp


@pytest.mark.parametrize("name", [f[0] for f in CSV_FACTS])
def test_csv_units_come_from_the_header(name: str) -> None:
    result = nvidia_smi_csv.parse(real_text(f"nvidia-smi/{name}"))
    units = {c.name: c.unit for c in result.columns}
    assert units["memory.total"] == "MiB"
    assert units["name"] is None


@pytest.mark.parametrize("name", [f[0] for f in CSV_FACTS])
def test_csv_not_available_is_none_with_reason(name: str) -> None:
    row = nvidia_smi_csv.parse(real_text(f"nvidia-smi/{name}")).rows[0]
    assert row.value("pcie.link.gen.hostmax") is None
    assert row.unavailable["pcie.link.gen.hostmax"] == "[N/A]"
    assert row.unavailable["display_mode"] == "[Requested functionality has been deprecated]"


def test_csv_noheader_nounits_with_fields() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559, [Not Supported]\n1, NVIDIA H100 80GB HBM3, 81559, 42\n"
    result = nvidia_smi_csv.parse(text, fields=["index", "name", "memory.total", "fan.speed"])
    assert not result.had_header
    assert [r.number("memory.total") for r in result.rows] == [81559.0, 81559.0]
    assert result.rows[0].unavailable["fan.speed"] == "[Not Supported]"
    assert result.rows[1].number("fan.speed") == 42.0


def test_csv_noheader_without_fields_is_refused() -> None:
    with pytest.raises(ParseError, match="no header row"):
        nvidia_smi_csv.parse("0, NVIDIA H100 80GB HBM3, 81559\n")


def test_csv_short_row_names_its_line() -> None:
    with pytest.raises(ParseError, match="2 values for 3 columns") as caught:
        nvidia_smi_csv.parse("index, name, memory.total [MiB]\n0, NVIDIA H100\n")
    assert caught.value.line == 2


# topo -m ------------------------------------------------------------------------------------

TOPO_FACTS = [
    # file, devices, GPU0-GPU1 link, GPU0 CPU affinity, GPU0 NUMA, legend entries
    ("mleng-a100-8gpu-topo-m.txt", 8, "NV12", "0-23", "0", 0),
    ("mleng-h100-8gpu-topo-m.txt", 8, "NV18", "0-51", "0", 0),
    ("nccl-issue1617-4xh100-nv6-topo-m-with-nics-legend-cut.txt", 8, "NV6", "6,14,22,30", "3", 4),
    ("nge-h100-80gb-hbm3-topo-m-1gpu.txt", 1, None, "0-19", "0", 7),
    ("nge-h200-topo-m.txt", 1, None, "0-23", "0", 7),
]
TOPO_IDS = [f[0] for f in TOPO_FACTS]


@pytest.mark.parametrize("facts", TOPO_FACTS, ids=TOPO_IDS)
def test_topo_values(facts: tuple[str, int, str | None, str, str, int]) -> None:
    name, devices, link, cpus, numa, legend = facts
    topo = nvidia_smi_topo.parse(real_text(f"nvidia-smi/{name}"))
    assert len(topo.devices) == devices
    if link is not None:
        assert topo.link("GPU0", "GPU1") == link
    assert topo.link("GPU0", "GPU0") == "X"
    assert topo.gpus[0].cpu_affinity == cpus
    assert topo.gpus[0].numa_affinity == numa
    assert len(topo.legend) == legend


def test_topo_second_numa_node() -> None:
    topo = nvidia_smi_topo.parse(real_text("nvidia-smi/mleng-h100-8gpu-topo-m.txt"))
    assert topo.gpus[7].cpu_affinity == "52-103"
    assert topo.gpus[7].numa_affinity == "1"
    assert topo.nvlink_count("GPU3", "GPU4") == 18


def test_topo_nics_and_cut_legend() -> None:
    topo = nvidia_smi_topo.parse(
        real_text("nvidia-smi/nccl-issue1617-4xh100-nv6-topo-m-with-nics-legend-cut.txt")
    )
    assert topo.nics == ("NIC0", "NIC1", "NIC2", "NIC3")
    assert topo.link("GPU2", "NIC2") == "PIX"
    assert topo.link("NIC0", "GPU1") == "SYS"
    assert topo.gpus[0].gpu_numa_id is None  # "N/A"
    assert topo.nic_names == {}
    assert any("NIC Legend" in w for w in topo.warnings)


def test_topo_ansi_and_tabs() -> None:
    topo = nvidia_smi_topo.parse(real_text("nvidia-smi/nge-h100-80gb-hbm3-topo-m-1gpu.txt"))
    assert topo.devices == ("GPU0",)
    assert topo.legend["NV#"] == "Connection traversing a bonded set of # NVLinks"
    assert topo.warnings == ()


def test_topo_realigned_copy_without_legend_warns() -> None:
    topo = nvidia_smi_topo.parse(real_text("nvidia-smi/mleng-a100-8gpu-topo-m.txt"))
    assert topo.warnings == ("no 'Legend' section",)


def test_topo_nic_legend_maps_names() -> None:
    text = (
        "\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tPXB\t0-55\t0\t\tN/A\n"
        "NIC0\tPXB\t X \n\nLegend:\n\n  X    = Self\n"
        + "".join(f"  {k} = ...\n" for k in ("SYS", "NODE", "PHB", "PXB", "PIX", "NV#"))
        + "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    topo = nvidia_smi_topo.parse(text)
    assert topo.nic_names == {"NIC0": "mlx5_0"}
    assert topo.warnings == ()


def test_topo_unknown_cell_names_its_line() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t FOO \n"
    with pytest.raises(ParseError, match="unknown connection kind 'FOO'") as caught:
        nvidia_smi_topo.parse(text)
    assert caught.value.line == 3


# nvlink -s ----------------------------------------------------------------------------------


def test_nvlink_a100_all_links() -> None:
    status = nvlink.parse(real_text("nvidia-smi/gpud-a100-80gb-8gpu-nvlink-status.txt"))
    assert len(status.gpus) == 8
    assert {g.active_links for g in status.gpus} == {12}
    assert status.gpus[7].links[11].speed_gbytes_per_s == 25.0
    assert status.gpus[7].uuid == "GPU-754035b4-4708-efcd-b261-623aea38bcad"


def test_nvlink_h100_tab_indented() -> None:
    gpu = nvlink.parse(real_text("nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt")).gpus[0]
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert len(gpu.links) == 18
    assert gpu.active_links == 18
    assert gpu.links[0].speed_gbytes_per_s == 26.562


def test_nvlink_inactive_links() -> None:
    status = nvlink.parse(
        real_text("nvidia-smi/azhpcdiag-issue73-v100-nvlink-s-inactive-links-excerpt.txt")
    )
    gpu = status.gpus[0]
    assert gpu.index == 3
    assert [link.link for link in gpu.links if not link.active] == [3, 5]
    assert gpu.active_links == 4
    assert status.warnings == ("line 2: elision '....': lines are missing here",)


def test_nvlink_all_inactive_error_is_kept() -> None:
    gpu = nvlink.parse(
        real_text("nvidia-smi/aznhc-a100-80gb-nvlink-status-all-links-inactive.txt")
    ).gpus[0]
    assert gpu.index == 6
    assert gpu.links == ()
    assert gpu.error == "NVML: Unable to retrieve NVLink information as all links are inactive"


def test_nvlink_bad_speed_names_its_line() -> None:
    with pytest.raises(ParseError, match="link speed") as caught:
        nvlink.parse("GPU 0: NVIDIA H100 (UUID: GPU-x)\n\t Link 0: fast\n")
    assert caught.value.line == 2
