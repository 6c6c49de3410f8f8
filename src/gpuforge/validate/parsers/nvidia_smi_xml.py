"""``nvidia-smi -q -x`` XML (DTD ``nvsmi_device_v*``).

The same :class:`NvidiaSmiReport` as the ``-q`` text parser; ``fields`` keys are the XML element
paths below ``<gpu>`` (``ecc_errors/volatile/dram_uncorrectable``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping

from gpuforge.validate.parsers._common import ParseError, require_text
from gpuforge.validate.parsers.nvidia_smi_common import (
    FieldPaths,
    GpuInfo,
    NvidiaSmiReport,
    gpu_info,
    integer,
    reported,
)

_HISTOGRAM_PREFIX = "row_remapper_histogram_"


def _flatten(element: ET.Element, prefix: str, out: dict[str, str]) -> None:
    counts: Counter[str] = Counter()
    for child in element:
        seen = counts[child.tag]
        counts[child.tag] += 1
        name = child.tag if seen == 0 else f"{child.tag}[{seen}]"
        path = f"{prefix}/{name}" if prefix else name
        if len(child):
            _flatten(child, path, out)
        else:
            out[path] = (child.text or "").strip()


#: Where ``-q -x`` puts each value (element paths below ``<gpu>``).
PATHS = FieldPaths(
    product_name="product_name",
    architecture="product_architecture",
    serial="serial",
    uuid="uuid",
    minor_number="minor_number",
    vbios_version="vbios_version",
    persistence_mode="persistence_mode",
    mig_mode="mig_mode/current_mig",
    pcie_gen_current="pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    pcie_gen_max="pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    pcie_width_current="pci/pci_gpu_link_info/link_widths/current_link_width",
    pcie_width_max="pci/pci_gpu_link_info/link_widths/max_link_width",
    temperature_c="temperature/gpu_temp",
    power_sections=("gpu_power_readings", "power_readings"),
    power_draw_w=("power_draw", "instant_power_draw"),
    power_limit_w=("current_power_limit", "power_limit"),
    memory_total_mib="fb_memory_usage/total",
    memory_used_mib="fb_memory_usage/used",
    ecc_mode="ecc_mode/current_ecc",
    ecc_scopes=("volatile", "aggregate"),
    ecc_base="ecc_errors/{scope}",
    sram_correctable="sram_correctable",
    sram_uncorrectable=(
        "sram_uncorrectable",
        "sram_uncorrectable_parity",
        "sram_uncorrectable_secded",
    ),
    dram_correctable="dram_correctable",
    dram_uncorrectable="dram_uncorrectable",
    retired_pages_sbe="retired_pages/multiple_single_bit_retirement/retired_count",
    retired_pages_dbe="retired_pages/double_bit_retirement/retired_count",
    retired_pages_pending="retired_pages/pending_retirement",
    remapped_base="remapped_rows",
    remapped_correctable="remapped_row_corr",
    remapped_uncorrectable="remapped_row_unc",
    remapped_pending="remapped_row_pending",
    remapped_failure="remapped_row_failure",
    fabric_state="fabric/state",
    fabric_status="fabric/status",
)


def _histogram(fields: Mapping[str, str]) -> dict[str, int]:
    histogram = {}
    for path, value in fields.items():
        _, _, leaf = path.rpartition("/")
        if path.startswith("remapped_rows/") and leaf.startswith(_HISTOGRAM_PREFIX):
            count = integer(value)
            if count is not None:
                histogram[leaf.removeprefix(_HISTOGRAM_PREFIX).capitalize()] = count
    return histogram


def _event_reasons(fields: Mapping[str, str]) -> tuple[str, ...]:
    active = []
    for path, value in fields.items():
        head, _, leaf = path.rpartition("/")
        if head in ("clocks_event_reasons", "clocks_throttle_reasons") and value == "Active":
            for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
                leaf = leaf.removeprefix(prefix)
            active.append(leaf)
    return tuple(active)


def _gpu(element: ET.Element) -> GpuInfo:
    fields: dict[str, str] = {}
    _flatten(element, "", fields)
    bus_id = element.get("id") or reported(fields.get("pci/pci_bus_id"))
    return gpu_info(bus_id, fields, PATHS, histogram=_histogram, event_reasons=_event_reasons)


def parse(text: str) -> NvidiaSmiReport:
    """Parse ``nvidia-smi -q -x``; raise ParseError for text that is not that XML."""
    require_text(text, "nvidia-smi -q -x")
    try:
        # The input is a tool's own report, read from a file the user names; the standard
        # parser neither fetches the external DTD nor expands external entities.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError as exc:
        line, _column = exc.position
        raise ParseError(f"not well-formed XML: {exc}", line=line) from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"root element is <{root.tag}>, not <nvidia_smi_log>", line=1)
    warnings = []
    gpus = tuple(_gpu(element) for element in root.findall("gpu"))
    attached = integer(root.findtext("attached_gpus"))
    if attached is not None and attached != len(gpus):
        warnings.append(
            f"<attached_gpus> says {attached} but {len(gpus)} <gpu> element(s) are present"
        )
    if not gpus:
        warnings.append("the report holds no <gpu> element")
    return NvidiaSmiReport(
        timestamp=reported(root.findtext("timestamp")),
        driver_version=reported(root.findtext("driver_version")),
        cuda_version=reported(root.findtext("cuda_version")),
        attached_gpus=attached,
        gpus=gpus,
        warnings=tuple(warnings),
    )
