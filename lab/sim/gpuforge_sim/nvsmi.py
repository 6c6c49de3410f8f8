"""Simulated ``nvidia-smi``: -q, -q -x, --query-gpu, -L, topo -m, nvlink -s, --version, table."""

from __future__ import annotations

import sys
import time
from typing import Any
from xml.sax.saxutils import escape

from . import SIM_BANNER
from .csv_fields import QUERY_FIELDS
from .gpu import REASON_BITS, GpuHealth, gpu_health
from .lifecycle import record_cleared
from .state import (
    Lab,
    NodeView,
    SimError,
    cuda_version,
    driver_version,
    load_lab,
)

# A -q entry: (text key or None, xml tag or None, value str | list of entries).
Entry = tuple[str | None, str | None, "str | list[Entry]"]

USAGE = """NVIDIA System Management Interface -- v{driver}

NVSMI provides monitoring information for Tesla and select Quadro devices.
The data is presented in either a plain text or an XML format, via stdout or a file.

Usage: nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -x,   --xml-format          Produce XML output.
    -i,   --id=                 Target a specific GPU.
    -r    --gpu-reset           Trigger reset of the GPU.
    --query-gpu=                Information about GPU.
    --format=                   Comma separated list of format options: csv, noheader, nounits.
    topo -m                     Display the GPU/NIC topology matrix.
    nvlink -s                   Display NVLink status.

({banner})
"""

ACTIVE = {True: "Active", False: "Not Active"}
REASON_TEXT = [
    ("Idle", "gpu_idle"),
    ("Applications Clocks Setting", "applications_clocks_setting"),
    ("SW Power Cap", "sw_power_cap"),
    ("HW Slowdown", "hw_slowdown"),
]
REASON_TEXT_HW = [
    ("HW Thermal Slowdown", "hw_thermal_slowdown"),
    ("HW Power Brake Slowdown", "hw_power_brake_slowdown"),
]
REASON_TEXT_TAIL = [
    ("Sync Boost", "sync_boost"),
    ("SW Thermal Slowdown", "sw_thermal_slowdown"),
    ("Display Clock Setting", "display_clock_setting"),
]
XML_REASON = {
    "gpu_idle": "clocks_event_reason_gpu_idle",
    "applications_clocks_setting": "clocks_event_reason_applications_clocks_setting",
    "sw_power_cap": "clocks_event_reason_sw_power_cap",
    "hw_slowdown": "clocks_event_reason_hw_slowdown",
    "hw_thermal_slowdown": "clocks_event_reason_hw_thermal_slowdown",
    "hw_power_brake_slowdown": "clocks_event_reason_hw_power_brake_slowdown",
    "sync_boost": "clocks_event_reason_sync_boost",
    "sw_thermal_slowdown": "clocks_event_reason_sw_thermal_slowdown",
    "display_clock_setting": "clocks_event_reason_display_clocks_setting",
}


def _e(text: str | None, tag: str | None, value: str | list[Entry]) -> Entry:
    return (text, tag, value)


def _yn(b: bool) -> str:
    return "Yes" if b else "No"


def _clocks(gr: int, mem: int, vid: int) -> list[Entry]:
    return [
        _e("Graphics", "graphics_clock", f"{gr} MHz"),
        _e("SM", "sm_clock", f"{gr} MHz"),
        _e("Memory", "mem_clock", f"{mem} MHz"),
        _e("Video", "video_clock", f"{vid} MHz"),
    ]


def gpu_entries(g: GpuHealth, driver: str, fabric_ok: bool) -> list[Entry]:
    s = g.sku
    used = 1
    hist = g.histogram()
    reasons: list[Entry] = [_e(t, XML_REASON[k], ACTIVE[g.reasons[k]]) for t, k in REASON_TEXT]
    reasons += [_e("    " + t, XML_REASON[k], ACTIVE[g.reasons[k]]) for t, k in REASON_TEXT_HW]
    reasons += [_e(t, XML_REASON[k], ACTIVE[g.reasons[k]]) for t, k in REASON_TEXT_TAIL]
    ecc_vol: list[Entry] = [
        _e("SRAM Correctable", "sram_correctable", "0"),
        _e("SRAM Uncorrectable Parity", "sram_uncorrectable_parity", "0"),
        _e("SRAM Uncorrectable SEC-DED", "sram_uncorrectable_secded", "0"),
        _e("DRAM Correctable", "dram_correctable", str(g.dram_correctable)),
        _e("DRAM Uncorrectable", "dram_uncorrectable", str(g.dram_uncorrectable)),
    ]
    ecc_agg = [*ecc_vol, _e("SRAM Threshold Exceeded", "sram_threshold_exceeded", "No")]
    return [
        _e("Product Name", "product_name", s.product_name),
        _e("Product Brand", "product_brand", "NVIDIA"),
        _e("Product Architecture", "product_architecture", s.architecture),
        _e("Display Mode", "display_mode", "Enabled"),
        _e("Display Active", "display_active", "Disabled"),
        _e("Persistence Mode", "persistence_mode", "Enabled"),
        _e("Addressing Mode", "addressing_mode", "None"),
        _e(
            "MIG Mode",
            "mig_mode",
            [_e("Current", "current_mig", "Disabled"), _e("Pending", "pending_mig", "Disabled")],
        ),
        _e(None, "mig_devices", "None"),
        _e("Accounting Mode", "accounting_mode", "Disabled"),
        _e("Accounting Mode Buffer Size", "accounting_mode_buffer_size", "4000"),
        _e(
            "Driver Model",
            "driver_model",
            [_e("Current", "current_dm", "N/A"), _e("Pending", "pending_dm", "N/A")],
        ),
        _e("Serial Number", "serial", g.serial),
        _e("GPU UUID", "uuid", g.uuid),
        _e("Minor Number", "minor_number", str(g.physical)),
        _e("VBIOS Version", "vbios_version", s.vbios),
        _e("MultiGPU Board", "multigpu_board", "No"),
        _e("Board ID", "board_id", f"0x{g.bus:02x}00"),
        _e("Board Part Number", "board_part_number", s.board_part),
        _e("GPU Part Number", "gpu_part_number", s.gpu_part),
        _e("FRU Part Number", "gpu_fru_part_number", "N/A"),
        _e("Module ID", "gpu_module_id", str(g.physical + 1)),
        _e(
            "Inforom Version",
            "inforom_version",
            [
                _e("Image Version", "img_version", s.inforom_image),
                _e("OEM Object", "oem_object", "2.1"),
                _e("ECC Object", "ecc_object", "7.16"),
                _e("Power Management Object", "pwr_object", "N/A"),
            ],
        ),
        _e(
            "GPU Operation Mode",
            "gpu_operation_mode",
            [_e("Current", "current_gom", "N/A"), _e("Pending", "pending_gom", "N/A")],
        ),
        _e("GSP Firmware Version", "gsp_firmware_version", driver),
        _e(
            "GPU Virtualization Mode",
            "gpu_virtualization_mode",
            [
                _e("Virtualization Mode", "virtualization_mode", "None"),
                _e("Host VGPU Mode", "host_vgpu_mode", "N/A"),
            ],
        ),
        _e(
            "GPU Reset Status",
            "gpu_reset_status",
            [
                _e("Reset Required", "reset_required", _yn(g.reset_required)),
                _e("Drain and Reset Recommended", "drain_and_reset_recommended", "No"),
            ],
        ),
        _e("IBMNPU", "ibmnpu", [_e("Relaxed Ordering Mode", "relaxed_ordering_mode", "N/A")]),
        _e(
            "PCI",
            "pci",
            [
                _e("Bus", "pci_bus", f"0x{g.bus:02X}"),
                _e("Device", "pci_device", "0x00"),
                _e("Domain", "pci_domain", "0x0000"),
                _e("Device Id", "pci_device_id", s.device_id),
                _e("Bus Id", "pci_bus_id", g.bus_id),
                _e("Sub System Id", "pci_sub_system_id", s.subsys_id),
                _e(
                    "GPU Link Info",
                    "pci_gpu_link_info",
                    [
                        _e(
                            "PCIe Generation",
                            "pcie_gen",
                            [
                                _e("Max", "max_link_gen", str(s.pcie_gen)),
                                _e("Current", "current_link_gen", str(g.pcie_gen)),
                                _e("Device Current", "device_current_link_gen", str(g.pcie_gen)),
                                _e("Device Max", "max_device_link_gen", str(s.pcie_gen)),
                                _e("Host Max", "max_host_link_gen", str(s.pcie_gen)),
                            ],
                        ),
                        _e(
                            "Link Width",
                            "link_widths",
                            [
                                _e("Max", "max_link_width", "16x"),
                                _e("Current", "current_link_width", f"{g.pcie_width}x"),
                            ],
                        ),
                    ],
                ),
                _e(
                    "Bridge Chip",
                    "pci_bridge_chip",
                    [
                        _e("Type", "bridge_chip_type", "N/A"),
                        _e("Firmware", "bridge_chip_fw", "N/A"),
                    ],
                ),
                _e("Replays Since Reset", "replay_counter", "0"),
                _e("Replay Number Rollovers", "replay_rollover_counter", "0"),
                _e("Tx Throughput", "tx_util", "0 KB/s"),
                _e("Rx Throughput", "rx_util", "0 KB/s"),
                _e("Atomic Caps Inbound", "atomic_caps_inbound", "N/A"),
                _e(
                    "Atomic Caps Outbound",
                    "atomic_caps_outbound",
                    "FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64",
                ),
            ],
        ),
        _e("Fan Speed", "fan_speed", "N/A"),
        _e("Performance State", "performance_state", "P0"),
        _e("Clocks Event Reasons", "clocks_event_reasons", reasons),
        _e("Sparse Operation Mode", "sparse_operation_mode", "Disabled"),
        _e(
            "FB Memory Usage",
            "fb_memory_usage",
            [
                _e("Total", "total", f"{s.fb_total_mib} MiB"),
                _e("Reserved", "reserved", f"{s.fb_reserved_mib} MiB"),
                _e("Used", "used", f"{used} MiB"),
                _e("Free", "free", f"{s.fb_total_mib - s.fb_reserved_mib - used} MiB"),
            ],
        ),
        _e(
            "BAR1 Memory Usage",
            "bar1_memory_usage",
            [
                _e("Total", "total", f"{s.bar1_total_mib} MiB"),
                _e("Used", "used", "1 MiB"),
                _e("Free", "free", f"{s.bar1_total_mib - 1} MiB"),
            ],
        ),
        _e(
            "Conf Compute Protected Memory Usage",
            "cc_protected_memory_usage",
            [
                _e("Total", "total", "0 MiB"),
                _e("Used", "used", "0 MiB"),
                _e("Free", "free", "0 MiB"),
            ],
        ),
        _e("Compute Mode", "compute_mode", "Default"),
        _e(
            "Utilization",
            "utilization",
            [
                _e("Gpu", "gpu_util", "0 %"),
                _e("Memory", "memory_util", "0 %"),
                _e("Encoder", "encoder_util", "0 %"),
                _e("Decoder", "decoder_util", "0 %"),
                _e("JPEG", "jpeg_util", "0 %"),
                _e("OFA", "ofa_util", "0 %"),
            ],
        ),
        _e(
            "ECC Mode",
            "ecc_mode",
            [_e("Current", "current_ecc", "Enabled"), _e("Pending", "pending_ecc", "Enabled")],
        ),
        _e(
            "ECC Errors",
            "ecc_errors",
            [
                _e("Volatile", "volatile", ecc_vol),
                _e("Aggregate", "aggregate", ecc_agg),
                _e(
                    "Aggregate Uncorrectable SRAM Sources",
                    "aggregate_uncorrectable_sram_sources",
                    [
                        _e("SRAM L2", "sram_l2", "0"),
                        _e("SRAM SM", "sram_sm", "0"),
                        _e("SRAM Microcontroller", "sram_microcontroller", "0"),
                        _e("SRAM PCIE", "sram_pcie", "0"),
                        _e("SRAM Other", "sram_other", "0"),
                    ],
                ),
            ],
        ),
        _e(
            "Retired Pages",
            "retired_pages",
            [
                _e("Single Bit ECC", "multiple_single_bit_retirement", "N/A"),
                _e("Double Bit ECC", "double_bit_retirement", "N/A"),
                _e("Pending Page Blacklist", "pending_blacklist", "N/A"),
            ],
        ),
        _e(
            "Remapped Rows",
            "remapped_rows",
            [
                _e("Correctable Error", "remapped_row_corr", str(g.remap_corr)),
                _e("Uncorrectable Error", "remapped_row_unc", str(g.remap_unc)),
                _e("Pending", "remapped_row_pending", _yn(g.remap_pending)),
                _e("Remapping Failure Occurred", "remapped_row_failure", _yn(g.remap_failure)),
                _e(
                    "Bank Remap Availability Histogram",
                    "row_remapper_histogram",
                    [
                        _e("Max", "row_remapper_histogram_max", f"{hist[0]} bank(s)"),
                        _e("High", "row_remapper_histogram_high", f"{hist[1]} bank(s)"),
                        _e("Partial", "row_remapper_histogram_partial", f"{hist[2]} bank(s)"),
                        _e("Low", "row_remapper_histogram_low", f"{hist[3]} bank(s)"),
                        _e("None", "row_remapper_histogram_none", f"{hist[4]} bank(s)"),
                    ],
                ),
            ],
        ),
        _e(
            "Temperature",
            "temperature",
            [
                _e("GPU Current Temp", "gpu_temp", f"{g.temp_c} C"),
                _e("GPU T.Limit Temp", "gpu_temp_tlimit", f"{87 - g.temp_c} C"),
                _e("GPU Shutdown T.Limit Temp", "gpu_temp_max_threshold", "-8 C"),
                _e("GPU Slowdown T.Limit Temp", "gpu_temp_slow_threshold", "-2 C"),
                _e("GPU Max Operating T.Limit Temp", "gpu_temp_max_gpu_threshold", "0 C"),
                _e("GPU Target Temperature", "gpu_target_temperature", "N/A"),
                _e("Memory Current Temp", "memory_temp", f"{g.mem_temp_c} C"),
                _e("Memory Max Operating T.Limit Temp", "gpu_temp_max_mem_threshold", "0 C"),
            ],
        ),
        _e(
            "GPU Power Readings",
            "gpu_power_readings",
            [
                _e(None, "power_state", "P0"),
                _e("Power Draw", "power_draw", f"{g.power_w:.2f} W"),
                _e("Current Power Limit", "current_power_limit", f"{s.power_limit_w:.2f} W"),
                _e("Requested Power Limit", "requested_power_limit", f"{s.power_limit_w:.2f} W"),
                _e("Default Power Limit", "default_power_limit", f"{s.power_limit_w:.2f} W"),
                _e("Min Power Limit", "min_power_limit", f"{s.min_power_limit_w:.2f} W"),
                _e("Max Power Limit", "max_power_limit", f"{s.power_limit_w:.2f} W"),
            ],
        ),
        _e("Clocks", "clocks", _clocks(g.graphics_mhz, s.max_memory_mhz, s.max_video_mhz)),
        _e(
            "Applications Clocks",
            "applications_clocks",
            [
                _e("Graphics", "graphics_clock", f"{g.app_graphics_mhz or s.max_graphics_mhz} MHz"),
                _e("Memory", "mem_clock", f"{s.max_memory_mhz} MHz"),
            ],
        ),
        _e(
            "Default Applications Clocks",
            "default_applications_clocks",
            [
                _e("Graphics", "graphics_clock", f"{s.max_graphics_mhz} MHz"),
                _e("Memory", "mem_clock", f"{s.max_memory_mhz} MHz"),
            ],
        ),
        _e("Deferred Clocks", "deferred_clocks", [_e("Memory", "mem_clock", "N/A")]),
        _e(
            "Max Clocks",
            "max_clocks",
            _clocks(s.max_graphics_mhz, s.max_memory_mhz, s.max_video_mhz),
        ),
        _e(
            "Max Customer Boost Clocks",
            "max_customer_boost_clocks",
            [_e("Graphics", "graphics_clock", f"{s.max_graphics_mhz} MHz")],
        ),
        _e(
            "Clock Policy",
            "clock_policy",
            [
                _e("Auto Boost", "auto_boost", "N/A"),
                _e("Auto Boost Default", "auto_boost_default", "N/A"),
            ],
        ),
        _e("Voltage", "voltage", [_e("Graphics", "graphics_volt", "670.000 mV")]),
        _e(
            "Fabric",
            "fabric",
            [
                _e("State", "state", "Completed" if fabric_ok else "In Progress"),
                _e("Status", "status", "Success" if fabric_ok else "N/A"),
            ],
        ),
        _e("Processes", "processes", "None"),
    ]


def _render_text(entries: list[Entry], depth: int, out: list[str]) -> None:
    for text, _tag, value in entries:
        if text is None:
            continue
        indent = "    " * depth
        if isinstance(value, list):
            out.append(f"{indent}{text}")
            _render_text(value, depth + 1, out)
        else:
            out.append(f"{(indent + text).ljust(42)}: {value}")


def _render_xml(entries: list[Entry], depth: int, out: list[str]) -> None:
    for _text, tag, value in entries:
        if tag is None:
            continue
        indent = "\t" * depth
        if isinstance(value, list):
            out.append(f"{indent}<{tag}>")
            _render_xml(value, depth + 1, out)
            out.append(f"{indent}</{tag}>")
        elif tag == "processes" and value == "None":
            out.append(f"{indent}<processes>\n{indent}</processes>")
            out.append(f"{indent}<accounted_processes>\n{indent}</accounted_processes>")
        else:
            out.append(f"{indent}<{tag}>{escape(value)}</{tag}>")


def _timestamp() -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y")


def _missing_lines(node: NodeView) -> list[str]:
    return [
        f"Unable to determine the device handle for GPU0000:{node.bus_id(g):02X}:00.0: "
        "Unknown Error"
        for g in sorted(node.missing_gpus())
    ]


def _select(gpus: list[GpuHealth], ids: str | None) -> list[GpuHealth]:
    if ids is None:
        return gpus
    chosen = []
    for item in ids.split(","):
        key = item.strip()
        match = [
            g
            for g in gpus
            if key in (str(g.index), g.uuid, g.bus_id)
            or (":" in key and g.bus_id.endswith(key.upper()))
        ]
        if not match:
            raise SimError(f"No devices were found matching the id {key!r}", rc=6)
        chosen.extend(match)
    return chosen


def _fabric_ok(node: NodeView) -> bool:
    return not node.has("fabricmanager_down")


def cmd_query(lab: Lab, xml: bool, ids: str | None) -> int:
    node = lab.local()
    driver = driver_version()
    gpus = _select(gpu_health(node), ids)
    for line in _missing_lines(node):
        print(line, file=sys.stderr if xml else sys.stdout)
    if xml:
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
            "<nvidia_smi_log>",
            f"\t<timestamp>{_timestamp()}</timestamp>",
            f"\t<driver_version>{driver}</driver_version>",
            f"\t<cuda_version>{cuda_version(driver)}</cuda_version>",
            f"\t<attached_gpus>{len(gpus)}</attached_gpus>",
        ]
        for g in gpus:
            out.append(f'\t<gpu id="{g.bus_id}">')
            _render_xml(gpu_entries(g, driver, _fabric_ok(node)), 2, out)
            out.append("\t</gpu>")
        out.append("</nvidia_smi_log>")
        print("\n".join(out))
        return 0
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp'.ljust(42)}: {_timestamp()}",
        f"{'Driver Version'.ljust(42)}: {driver}",
        f"{'CUDA Version'.ljust(42)}: {cuda_version(driver)}",
        "",
        f"{'Attached GPUs'.ljust(42)}: {len(gpus)}",
    ]
    for g in gpus:
        out.append(f"GPU {g.bus_id}")
        _render_text(gpu_entries(g, driver, _fabric_ok(node)), 1, out)
        out.append("")
    print("\n".join(out))
    return 0


# ---- --query-gpu ---------------------------------------------------------------------------

_ALIASES = {
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "power.limit": "power.limit",
    "enforced.power.limit": "enforced.power.limit",
    "temperature.memory": "temperature.memory",
    "pcie.link.gen.gpucurrent": "pcie.link.gen.gpucurrent",
}


def csv_fields(
    g: GpuHealth, driver: str, count: int, fabric_ok: bool
) -> dict[str, tuple[str, str]]:
    """field → (value, unit) for ``--query-gpu``."""
    s = g.sku
    used = 1
    hist = g.histogram()
    f: dict[str, tuple[str, str]] = {
        "timestamp": (time.strftime("%Y/%m/%d %H:%M:%S.000"), ""),
        "driver_version": (driver, ""),
        "count": (str(count), ""),
        "name": (s.product_name, ""),
        "serial": (g.serial, ""),
        "uuid": (g.uuid, ""),
        "pci.bus_id": (g.bus_id, ""),
        "pci.domain": ("0x0000", ""),
        "pci.bus": (f"0x{g.bus:02X}", ""),
        "pci.device": ("0x00", ""),
        "pci.device_id": (s.device_id, ""),
        "pci.sub_device_id": (s.subsys_id, ""),
        "pcie.link.gen.current": (str(g.pcie_gen), ""),
        "pcie.link.gen.gpucurrent": (str(g.pcie_gen), ""),
        "pcie.link.gen.max": (str(s.pcie_gen), ""),
        "pcie.link.gen.gpumax": (str(s.pcie_gen), ""),
        "pcie.link.gen.hostmax": (str(s.pcie_gen), ""),
        "pcie.link.width.current": (str(g.pcie_width), ""),
        "pcie.link.width.max": ("16", ""),
        "index": (str(g.index), ""),
        "display_mode": ("Enabled", ""),
        "display_active": ("Disabled", ""),
        "persistence_mode": ("Enabled", ""),
        "accounting.mode": ("Disabled", ""),
        "vbios_version": (s.vbios, ""),
        "inforom.img": (s.inforom_image, ""),
        "inforom.oem": ("2.1", ""),
        "inforom.ecc": ("7.16", ""),
        "inforom.pwr": ("[N/A]", ""),
        "fan.speed": ("[N/A]", "%"),
        "pstate": ("P0", ""),
        "clocks_event_reasons.supported": ("0x00000000000001FF", ""),
        "clocks_event_reasons.active": (f"0x{g.reasons_mask:016X}", ""),
        "memory.total": (str(s.fb_total_mib), "MiB"),
        "memory.reserved": (str(s.fb_reserved_mib), "MiB"),
        "memory.used": (str(used), "MiB"),
        "memory.free": (str(s.fb_total_mib - s.fb_reserved_mib - used), "MiB"),
        "compute_mode": ("Default", ""),
        "compute_cap": (s.compute_cap, ""),
        "utilization.gpu": ("0", "%"),
        "utilization.memory": ("0", "%"),
        "ecc.mode.current": ("Enabled", ""),
        "ecc.mode.pending": ("Enabled", ""),
        "retired_pages.single_bit_ecc.count": ("[N/A]", ""),
        "retired_pages.double_bit.count": ("[N/A]", ""),
        "retired_pages.pending": ("[N/A]", ""),
        "remapped_rows.correctable": (str(g.remap_corr), ""),
        "remapped_rows.uncorrectable": (str(g.remap_unc), ""),
        "remapped_rows.pending": (_yn(g.remap_pending), ""),
        "remapped_rows.failure": (_yn(g.remap_failure), ""),
        "remapped_rows.histogram.max": (str(hist[0]), ""),
        "remapped_rows.histogram.high": (str(hist[1]), ""),
        "remapped_rows.histogram.partial": (str(hist[2]), ""),
        "remapped_rows.histogram.low": (str(hist[3]), ""),
        "remapped_rows.histogram.none": (str(hist[4]), ""),
        "temperature.gpu": (str(g.temp_c), ""),
        "temperature.memory": (str(g.mem_temp_c), ""),
        "power.draw": (f"{g.power_w:.2f}", "W"),
        "power.draw.average": (f"{g.power_w:.2f}", "W"),
        "power.draw.instant": (f"{g.power_w:.2f}", "W"),
        "power.limit": (f"{s.power_limit_w:.2f}", "W"),
        "enforced.power.limit": (f"{s.power_limit_w:.2f}", "W"),
        "power.default_limit": (f"{s.power_limit_w:.2f}", "W"),
        "power.min_limit": (f"{s.min_power_limit_w:.2f}", "W"),
        "power.max_limit": (f"{s.power_limit_w:.2f}", "W"),
        "clocks.current.graphics": (str(g.graphics_mhz), "MHz"),
        "clocks.current.sm": (str(g.graphics_mhz), "MHz"),
        "clocks.current.memory": (str(s.max_memory_mhz), "MHz"),
        "clocks.current.video": (str(s.max_video_mhz), "MHz"),
        "clocks.max.graphics": (str(s.max_graphics_mhz), "MHz"),
        "clocks.max.sm": (str(s.max_graphics_mhz), "MHz"),
        "clocks.max.memory": (str(s.max_memory_mhz), "MHz"),
        "mig.mode.current": ("Disabled", ""),
        "mig.mode.pending": ("Disabled", ""),
        "fabric.state": ("Completed" if fabric_ok else "In Progress", ""),
        "fabric.status": ("Success" if fabric_ok else "N/A", ""),
    }
    for key in REASON_BITS:
        f[f"clocks_event_reasons.{key}"] = (ACTIVE[g.reasons[key]], "")
    for kind in ("corrected", "uncorrected"):
        for when in ("volatile", "aggregate"):
            dram = g.dram_correctable if kind == "corrected" else g.dram_uncorrectable
            for part in ("device_memory", "dram"):
                f[f"ecc.errors.{kind}.{when}.{part}"] = (str(dram), "")
            f[f"ecc.errors.{kind}.{when}.sram"] = ("0", "")
            f[f"ecc.errors.{kind}.{when}.total"] = (str(dram), "")
            for part in ("register_file", "l1_cache", "l2_cache", "texture_memory", "cbu"):
                f[f"ecc.errors.{kind}.{when}.{part}"] = ("[N/A]", "")
    for key in list(f):
        if key.startswith("clocks_event_reasons."):
            f[key.replace("clocks_event_reasons.", "clocks_throttle_reasons.")] = f[key]
    return f


def cmd_query_gpu(lab: Lab, fields: str, fmt: str, ids: str | None) -> int:
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts:
        raise SimError('"--format" must include "csv"', rc=2)
    node = lab.local()
    driver = driver_version()
    gpus = _select(gpu_health(node), ids)
    names = [n.strip() for n in fields.split(",") if n.strip()]
    for line in _missing_lines(node):
        print(line, file=sys.stderr)
    rows: list[dict[str, tuple[str, str]]] = [
        csv_fields(g, driver, len(gpus), _fabric_ok(node)) for g in gpus
    ]
    probe = rows[0] if rows else csv_fields_dummy()
    canon = []
    for n in names:
        c = _ALIASES.get(n, n)
        if c not in probe and c in QUERY_FIELDS:
            for row in (*rows, probe):
                row[c] = ("[N/A]", QUERY_FIELDS[c])
        if c not in probe:
            raise SimError(
                f'Field "{n}" is not a valid field to query.\n\n'
                "For more information, run 'nvidia-smi --help-query-gpu'",
                rc=2,
            )
        canon.append(c)
    if "noheader" not in opts:
        header = []
        for c in canon:
            unit = probe[c][1]
            header.append(f"{c} [{unit}]" if unit else c)
        print(", ".join(header))
    for row in rows:
        vals = []
        for c in canon:
            v, unit = row[c]
            vals.append(
                v if ("nounits" in opts or not unit or v.startswith("[")) else f"{v} {unit}"
            )
        print(", ".join(vals))
    return 0


def csv_fields_dummy() -> dict[str, tuple[str, str]]:
    from .skus import SKUS  # noqa: PLC0415

    dummy = GpuHealth(0, 0, SKUS["H100-SXM-80GB"], 0x18, "", "", 5, 16, 0, 0, 0.0, 0)
    dummy.reasons = dict.fromkeys(REASON_BITS, False)
    return csv_fields(dummy, "", 0, True)


# ---- -L, topo, nvlink, version, table ---------------------------------------------------------


def cmd_list(lab: Lab) -> int:
    node = lab.local()
    driver_version()
    for line in _missing_lines(node):
        print(line)
    for g in gpu_health(node):
        print(f"GPU {g.index}: {g.sku.product_name} (UUID: {g.uuid})")
    return 0


def cmd_nvlink_status(lab: Lab, ids: str | None) -> int:
    node = lab.local()
    driver_version()
    for g in _select(gpu_health(node), ids):
        print(f"GPU {g.index}: {g.sku.product_name} (UUID: {g.uuid})")
        if g.nvlinks_up == 0:
            print("NVML: Unable to retrieve NVLink information as all links are inactive")
            continue
        for link in range(g.sku.nvlinks):
            state = "<inactive>" if link in g.nvlinks_down else f"{g.sku.nvlink_gbps} GB/s"
            print(f"\t Link {link}: {state}")
    return 0


CPU_AFFINITY = ("0-55,112-167", "56-111,168-223")
LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""  # noqa: E501


def cmd_topo(lab: Lab) -> int:
    node = lab.local()
    driver_version()
    gpus = gpu_health(node)
    sku = node.sku
    split = sku.numa_split if sku else 4
    nics = node.rails
    numa = {g.index: (0 if g.physical < split else 1) for g in gpus}
    nic_numa = {r["rail"]: (0 if r["rail"] < max(1, len(nics) // 2) else 1) for r in nics}

    def pci_rel(same_switch: bool, a: int, b: int) -> str:
        if same_switch:
            return "PIX"
        return "NODE" if a == b else "SYS"

    cols = [f"GPU{g.index}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    head = "\t".join([*cols, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = [f"\t\x1b[4m{head}\x1b[0m"]
    for g in gpus:
        row = [f"GPU{g.index}"]
        for h in gpus:
            if h.index == g.index:
                row.append(" X ")
            elif g.nvlinks_up and h.nvlinks_up:
                row.append(f"NV{min(g.nvlinks_up, h.nvlinks_up)}")
            else:
                row.append(pci_rel(False, numa[g.index], numa[h.index]))
        for i, r in enumerate(nics):
            row.append(pci_rel(r["rail"] == g.physical, numa[g.index], nic_numa[r["rail"]]))
            _ = i
        row += [CPU_AFFINITY[numa[g.index]], str(numa[g.index]), "", "N/A"]
        lines.append("\t".join(row[:-2]) + "\t\t" + row[-1])
    for i, r in enumerate(nics):
        row = [f"NIC{i}"]
        for g in gpus:
            row.append(pci_rel(r["rail"] == g.physical, numa[g.index], nic_numa[r["rail"]]))
        for j, r2 in enumerate(nics):
            row.append(
                " X " if i == j else pci_rel(False, nic_numa[r["rail"]], nic_numa[r2["rail"]])
            )
        lines.append("\t".join(row))
    lines.append(LEGEND)
    if nics:
        lines.append("\nNIC Legend:\n")
        lines += [f"  NIC{i}: {r['device']}" for i, r in enumerate(nics)]
    lines.append("")
    print("\n".join(lines))
    return 0


def cmd_version(driver: str) -> int:
    print(f"NVIDIA-SMI version  : {driver}")
    print(f"NVML version        : {driver.rsplit('.', 1)[0]}")
    print(f"DRIVER version      : {driver}")
    print(f"CUDA Version        : {cuda_version(driver)}")
    print(f"({SIM_BANNER})")
    return 0


def _cells(a: str, b: str, c: str) -> str:
    return f"| {a:<39} | {b:<22} | {c:>20} |"


def cmd_table(lab: Lab) -> int:
    node = lab.local()
    driver = driver_version()
    gpus = gpu_health(node)
    for line in _missing_lines(node):
        print(line)
    out = [time.strftime("%a %b %e %H:%M:%S %Y")]
    bar = "+" + "-" * 89 + "+"
    sep = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    out += [
        bar,
        f"| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} "
        f"CUDA Version: {cuda_version(driver):<9}|",
        "|-----------------------------------------+------------------------+----------------------+",
        _cells(
            "GPU  Name                 Persistence-M",
            "Bus-Id          Disp.A",
            "Volatile Uncorr. ECC",
        ),
        _cells(
            "Fan  Temp   Perf          Pwr:Usage/Cap",
            "          Memory-Usage",
            "GPU-Util  Compute M.",
        ),
        _cells("", "", "              MIG M."),
        "|=========================================+========================+======================|",
    ]
    for g in gpus:
        s = g.sku
        name = s.product_name[:24]
        out.append(
            f"| {g.index:>3}  {name:<24}      On  |   {g.bus_id} Off | {g.dram_uncorrectable:>20} |"
        )
        power = f"{round(g.power_w)}W /  {round(s.power_limit_w)}W"
        mem = f"1MiB /  {s.fb_total_mib}MiB"
        out.append(f"| N/A   {g.temp_c:>2}C    P0 {power:>26} | {mem:>22} |      0%      Default |")
        out.append(_cells("", "", "            Disabled"))
        out.append(sep)
    out += [
        "",
        bar,
        "| Processes:" + " " * 79 + "|",
        "|  GPU   GI   CI        PID   Type   Process name" + " " * 30 + "GPU Memory |",
        "|        ID   ID" + " " * 63 + "Usage      |",
        "|" + "=" * 89 + "|",
        "|  No running processes found" + " " * 61 + "|",
        bar,
    ]
    print("\n".join(out))
    return 0


#: A GPU with one of these active faults cannot be reset: it is lost until the node reboots.
LOST_KINDS = ("gpu_missing",)


def _lost(node: NodeView, phys: int) -> bool:
    for f in node.gpu_faults(phys):
        if f["kind"] in LOST_KINDS or (f["kind"] == "xid" and f.get("code") in (79, 119)):
            return True
    return False


def cmd_reset(lab: Lab, ids: str | None) -> int:
    """``nvidia-smi -r [-i ID]``: reset GPUs, clearing their faults that a reset clears."""
    node = lab.local()
    gpus = _select(gpu_health(node), ids)
    failed: list[str] = []
    cleared: list[str] = []
    done: list[str] = []
    for g in gpus:
        if _lost(node, g.physical):
            failed.append(f"  GPU {g.bus_id}: GPU is lost. Reboot the system to recover this GPU")
            continue
        cleared += [
            str(f["id"])
            for f in node.gpu_faults(g.physical)
            if f.get("clears_on") == "reset" and f.get("id")
        ]
        done.append(f"GPU {g.bus_id} was successfully reset.")
    if cleared:
        record_cleared(node.hostname, cleared, "reset")
    for line in done:
        print(line)
    if failed:
        print("The following GPUs could not be reset:")
        print("\n".join(failed))
        return 15
    print("All done.")
    return 0


def main(argv: list[str]) -> int:  # noqa: PLR0911, PLR0912 - one branch per option
    if any(a in ("-h", "--help") for a in argv):
        try:
            drv = driver_version()
        except SimError:
            drv = "unknown"
        print(USAGE.format(driver=drv, banner=SIM_BANNER))
        return 0
    if "--version" in argv:
        return cmd_version(driver_version())
    lab = load_lab()
    if argv[:1] == ["topo"]:
        if "-m" in argv or "--matrix" in argv:
            return cmd_topo(lab)
        raise SimError(
            "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2
        )
    ids: str | None = None
    opts: dict[str, Any] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-i", "--id") and i + 1 < len(args):
            ids = args[i + 1]
            i += 2
            continue
        if a.startswith("--id="):
            ids = a.split("=", 1)[1]
        elif a.startswith("--query-gpu="):
            opts["query_gpu"] = a.split("=", 1)[1]
        elif a.startswith("--format="):
            opts["format"] = a.split("=", 1)[1]
        elif a in ("-q", "--query"):
            opts["q"] = True
        elif a in ("-x", "--xml-format"):
            opts["x"] = True
        elif a == "-qx":
            opts["q"] = opts["x"] = True
        elif a in ("-r", "--gpu-reset"):
            opts["reset"] = True
        elif a in ("-L", "--list-gpus"):
            opts["L"] = True
        elif a == "nvlink":
            opts["nvlink"] = True
        elif a in ("-s", "--status"):
            opts["status"] = True
        elif a in ("-d", "--display") and i + 1 < len(args):
            i += 1  # display filter: the simulator always prints every section
        i += 1
    if opts.get("reset"):
        return cmd_reset(lab, ids)
    if opts.get("nvlink"):
        return cmd_nvlink_status(lab, ids)
    if "query_gpu" in opts:
        return cmd_query_gpu(lab, opts["query_gpu"], opts.get("format", "csv"), ids)
    if opts.get("q"):
        return cmd_query(lab, bool(opts.get("x")), ids)
    if opts.get("L"):
        return cmd_list(lab)
    return cmd_table(lab)
