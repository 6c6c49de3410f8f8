"""``nvidia-smi -q -x`` XML (DTD ``nvsmi_device_v*``).

The same :class:`NvidiaSmiReport` as the ``-q`` text parser; ``fields`` keys are the XML element
paths below ``<gpu>`` (``ecc_errors/volatile/dram_uncorrectable``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter

from gpuforge.validate.parsers._common import ParseError, require_text
from gpuforge.validate.parsers.nvidia_smi_common import (
    EccCounters,
    GpuInfo,
    NvidiaSmiReport,
    RemappedRows,
    integer,
    number,
    reported,
    sum_optional,
    yes_no,
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


def _first(fields: dict[str, str], *paths: str) -> str | None:
    for path in paths:
        if path in fields:
            return fields[path]
    return None


def _ecc(fields: dict[str, str], scope: str) -> EccCounters | None:
    base = f"ecc_errors/{scope}"
    if not any(k.startswith(base + "/") for k in fields):
        return None
    return EccCounters(
        sram_correctable=integer(fields.get(f"{base}/sram_correctable")),
        sram_uncorrectable=sum_optional(
            integer(fields.get(f"{base}/sram_uncorrectable")),
            integer(fields.get(f"{base}/sram_uncorrectable_parity")),
            integer(fields.get(f"{base}/sram_uncorrectable_secded")),
        ),
        dram_correctable=integer(fields.get(f"{base}/dram_correctable")),
        dram_uncorrectable=integer(fields.get(f"{base}/dram_uncorrectable")),
    )


def _remapped(fields: dict[str, str]) -> RemappedRows | None:
    if not any(k.startswith("remapped_rows/") for k in fields):
        return None  # "<remapped_rows>N/A</remapped_rows>" (MIG, or a GPU without remapping)
    histogram = {}
    for path, value in fields.items():
        _, _, leaf = path.rpartition("/")
        if path.startswith("remapped_rows/") and leaf.startswith(_HISTOGRAM_PREFIX):
            count = integer(value)
            if count is not None:
                histogram[leaf.removeprefix(_HISTOGRAM_PREFIX).capitalize()] = count
    return RemappedRows(
        correctable=integer(fields.get("remapped_rows/remapped_row_corr")),
        uncorrectable=integer(fields.get("remapped_rows/remapped_row_unc")),
        pending=yes_no(fields.get("remapped_rows/remapped_row_pending")),
        failure_occurred=yes_no(fields.get("remapped_rows/remapped_row_failure")),
        bank_availability=histogram,
    )


def _event_reasons(fields: dict[str, str]) -> tuple[str, ...]:
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
    power = (
        "gpu_power_readings"
        if "gpu_power_readings/power_draw" in fields
        or any(k.startswith("gpu_power_readings/") for k in fields)
        else "power_readings"
    )
    link = "pci/pci_gpu_link_info"
    return GpuInfo(
        pci_bus_id=element.get("id") or reported(fields.get("pci/pci_bus_id")),
        product_name=reported(fields.get("product_name")),
        architecture=reported(fields.get("product_architecture")),
        serial=reported(fields.get("serial")),
        uuid=reported(fields.get("uuid")),
        minor_number=integer(fields.get("minor_number")),
        vbios_version=reported(fields.get("vbios_version")),
        persistence_mode=reported(fields.get("persistence_mode")),
        mig_mode=reported(fields.get("mig_mode/current_mig")),
        pcie_gen_current=integer(fields.get(f"{link}/pcie_gen/current_link_gen")),
        pcie_gen_max=integer(fields.get(f"{link}/pcie_gen/max_link_gen")),
        pcie_width_current=integer(fields.get(f"{link}/link_widths/current_link_width")),
        pcie_width_max=integer(fields.get(f"{link}/link_widths/max_link_width")),
        temperature_c=number(fields.get("temperature/gpu_temp")),
        power_draw_w=number(_first(fields, f"{power}/power_draw", f"{power}/instant_power_draw")),
        power_limit_w=number(
            _first(fields, f"{power}/current_power_limit", f"{power}/power_limit")
        ),
        memory_total_mib=integer(fields.get("fb_memory_usage/total")),
        memory_used_mib=integer(fields.get("fb_memory_usage/used")),
        ecc_mode=reported(fields.get("ecc_mode/current_ecc")),
        ecc_volatile=_ecc(fields, "volatile"),
        ecc_aggregate=_ecc(fields, "aggregate"),
        retired_pages_sbe=integer(
            fields.get("retired_pages/multiple_single_bit_retirement/retired_count")
        ),
        retired_pages_dbe=integer(fields.get("retired_pages/double_bit_retirement/retired_count")),
        retired_pages_pending=yes_no(fields.get("retired_pages/pending_retirement")),
        remapped_rows=_remapped(fields),
        fabric_state=reported(fields.get("fabric/state")),
        fabric_status=reported(fields.get("fabric/status")),
        clocks_event_reasons_active=_event_reasons(fields),
        fields=fields,
    )


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
