"""``nvidia-smi -q`` text (also ``-q -d ECC``, ``-q -d PAGE_RETIREMENT`` and fragments of it).

The text is an indented tree of ``Key : Value`` lines under one ``GPU <bus id>`` header per GPU.
The parser builds that tree (``fields`` keeps every value by its ``A/B/C`` path; repeated sibling
keys, such as one ``Process ID`` per process, get ``[1]``, ``[2]`` suffixes) and lifts the values
that health checks need into :class:`GpuInfo`. It records what it could not read as warnings:
a GPU count lower than ``Attached GPUs``, author elisions (``[...]``), values out of column.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    require_text,
    split_lines,
)
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

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KEY_VALUE = re.compile(r"^(\s*)([^:]*?\S)\s*:(?:\s(.*))?$")
_ELISIONS = ("[...]", "...", "....")
_MIN_SIBLINGS_FOR_ALIGNMENT = 3


@dataclass(slots=True)
class _Section:
    header_line: int
    bus_id: str | None
    fields: dict[str, str] = field(default_factory=dict)
    last_line: int = 0


def _colon_column(line: str) -> int:
    return line.index(":")


def _read_section(lines: list[tuple[int, str]], section: _Section, warnings: list[str]) -> None:
    stack: list[tuple[int, str]] = []  # (indent, path)
    seen: dict[str, Counter[str]] = {}
    columns: dict[str, list[tuple[int, int, str]]] = {}
    for lineno, line in lines:
        section.last_line = lineno
        stripped = line.strip()
        if stripped in _ELISIONS:
            warnings.append(f"line {lineno}: elision {stripped!r}: values are missing here")
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        match = _KEY_VALUE.match(line)
        key = (match[2] if match else stripped).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        counter = seen.setdefault(parent, Counter())
        occurrence = counter[key]
        counter[key] += 1
        name = key if occurrence == 0 else f"{key}[{occurrence}]"
        path = f"{parent}/{name}" if parent else name
        if match:
            section.fields[path] = (match[3] or "").strip()
            columns.setdefault(parent, []).append((_colon_column(line), lineno, key))
        stack.append((indent, path))
    for entries in columns.values():
        if len(entries) < _MIN_SIBLINGS_FOR_ALIGNMENT:
            continue
        usual = Counter(col for col, _, _ in entries).most_common(1)[0][0]
        for col, lineno, key in entries:
            if col != usual:
                warnings.append(
                    f"line {lineno}: value of {key!r} is out of column "
                    f"({col + 1} instead of {usual + 1}): malformed output"
                )


def _first(fields: dict[str, str], *paths: str) -> str | None:
    for path in paths:
        if path in fields:
            return fields[path]
    return None


def _ecc(fields: dict[str, str], scope: str) -> EccCounters | None:
    base = f"ECC Errors/{scope}"
    if not any(k.startswith(base + "/") for k in fields):
        return None
    return EccCounters(
        sram_correctable=integer(fields.get(f"{base}/SRAM Correctable")),
        sram_uncorrectable=sum_optional(
            integer(fields.get(f"{base}/SRAM Uncorrectable")),
            integer(fields.get(f"{base}/SRAM Uncorrectable Parity")),
            integer(fields.get(f"{base}/SRAM Uncorrectable SEC-DED")),
        ),
        dram_correctable=integer(fields.get(f"{base}/DRAM Correctable")),
        dram_uncorrectable=integer(fields.get(f"{base}/DRAM Uncorrectable")),
    )


def _remapped(fields: dict[str, str]) -> RemappedRows | None:
    base = "Remapped Rows"
    if not any(k.startswith(base + "/") for k in fields):
        return None
    histogram_base = f"{base}/Bank Remap Availability Histogram/"
    histogram = {
        k.removeprefix(histogram_base): value
        for k, v in fields.items()
        if k.startswith(histogram_base) and (value := integer(v)) is not None
    }
    return RemappedRows(
        correctable=integer(fields.get(f"{base}/Correctable Error")),
        uncorrectable=integer(fields.get(f"{base}/Uncorrectable Error")),
        pending=yes_no(fields.get(f"{base}/Pending")),
        failure_occurred=yes_no(fields.get(f"{base}/Remapping Failure Occurred")),
        bank_availability=histogram,
    )


def _event_reasons(fields: dict[str, str]) -> tuple[str, ...]:
    active = []
    for path, value in fields.items():
        head, _, name = path.rpartition("/")
        top = head.split("/", 1)[0]
        if top in ("Clocks Event Reasons", "Clocks Throttle Reasons") and value == "Active":
            active.append(name)
    return tuple(active)


def gpu_from_fields(bus_id: str | None, fields: dict[str, str]) -> GpuInfo:
    """Lift the values health checks use out of one GPU's ``-q`` fields."""
    power = (
        "GPU Power Readings"
        if any(k.startswith("GPU Power Readings/") for k in fields)
        else ("Power Readings")
    )
    return GpuInfo(
        pci_bus_id=bus_id,
        product_name=reported(fields.get("Product Name")),
        architecture=reported(fields.get("Product Architecture")),
        serial=reported(fields.get("Serial Number")),
        uuid=reported(fields.get("GPU UUID")),
        minor_number=integer(fields.get("Minor Number")),
        vbios_version=reported(fields.get("VBIOS Version")),
        persistence_mode=reported(fields.get("Persistence Mode")),
        mig_mode=reported(fields.get("MIG Mode/Current")),
        pcie_gen_current=integer(fields.get("PCI/GPU Link Info/PCIe Generation/Current")),
        pcie_gen_max=integer(fields.get("PCI/GPU Link Info/PCIe Generation/Max")),
        pcie_width_current=integer(fields.get("PCI/GPU Link Info/Link Width/Current")),
        pcie_width_max=integer(fields.get("PCI/GPU Link Info/Link Width/Max")),
        temperature_c=number(fields.get("Temperature/GPU Current Temp")),
        power_draw_w=number(
            _first(fields, f"{power}/Power Draw", f"{power}/Instantaneous Power Draw")
        ),
        power_limit_w=number(
            _first(fields, f"{power}/Current Power Limit", f"{power}/Power Limit")
        ),
        memory_total_mib=integer(fields.get("FB Memory Usage/Total")),
        memory_used_mib=integer(fields.get("FB Memory Usage/Used")),
        ecc_mode=reported(fields.get("ECC Mode/Current")),
        ecc_volatile=_ecc(fields, "Volatile"),
        ecc_aggregate=_ecc(fields, "Aggregate"),
        retired_pages_sbe=integer(fields.get("Retired Pages/Single Bit ECC")),
        retired_pages_dbe=integer(fields.get("Retired Pages/Double Bit ECC")),
        retired_pages_pending=yes_no(fields.get("Retired Pages/Pending Page Blacklist")),
        remapped_rows=_remapped(fields),
        fabric_state=reported(fields.get("Fabric/State")),
        fabric_status=reported(fields.get("Fabric/Status")),
        clocks_event_reasons_active=_event_reasons(fields),
        fields=fields,
    )


def parse(text: str) -> NvidiaSmiReport:  # noqa: PLR0912 - one branch per kind of line the tool prints
    """Parse ``nvidia-smi -q`` text; raise ParseError when it is not that output at all."""
    require_text(text, "nvidia-smi -q")
    refuse_other_tool(text, "nvidia-smi -q")
    top: dict[str, str] = {}
    sections: list[_Section] = []
    bodies: list[list[tuple[int, str]]] = []
    warnings: list[str] = []
    for lineno, line in enumerate(split_lines(text), start=1):
        stripped = line.strip()
        if (
            not stripped
            or set(stripped) <= {"="}
            or stripped == "==============NVSMI LOG=============="
        ):
            continue
        if match := _GPU_HEADER.match(line):
            sections.append(_Section(header_line=lineno, bus_id=match[1]))
            bodies.append([])
            continue
        indented = line[:1] in (" ", "\t")
        if stripped in _ELISIONS and not indented:
            warnings.append(f"line {lineno}: elision {stripped!r}: values are missing here")
            continue
        if not indented:
            match = _KEY_VALUE.match(line)
            if match is None or sections:
                raise ParseError("not an 'nvidia-smi -q' line", line=lineno, text=line)
            top[match[2].strip()] = (match[3] or "").strip()
            continue
        if not sections:
            warnings.append(
                f"line {lineno}: values before any 'GPU <bus id>' header: "
                "a fragment of nvidia-smi -q; the GPU's identity is unknown"
            )
            sections.append(_Section(header_line=lineno, bus_id=None))
            bodies.append([])
        bodies[-1].append((lineno, line))
    if not sections:
        if "Driver Version" not in top:
            raise ParseError("no 'GPU <bus id>' section and no 'Driver Version' line")
        warnings.append("no 'GPU <bus id>' section: the report lists no GPU")
    gpus = []
    for section, body in zip(sections, bodies, strict=True):
        _read_section(body, section, warnings)
        if not section.fields:
            raise ParseError("GPU section holds no values", line=section.header_line)
        if "Product Name" in section.fields and "Processes" not in {
            k.split("/", 1)[0].split("[", 1)[0] for k in section.fields
        }:
            warnings.append(
                f"GPU {section.bus_id or '?'}: section ends at line {section.last_line} without "
                "'Processes': the output is cut"
            )
        gpus.append(gpu_from_fields(section.bus_id, section.fields))
    attached = integer(top.get("Attached GPUs"))
    if attached is not None and attached != len(gpus):
        warnings.append(
            f"'Attached GPUs' says {attached} but {len(gpus)} GPU section(s) are present"
        )
    return NvidiaSmiReport(
        timestamp=reported(top.get("Timestamp")),
        driver_version=reported(top.get("Driver Version")),
        cuda_version=reported(top.get("CUDA Version")),
        attached_gpus=attached,
        gpus=tuple(gpus),
        warnings=tuple(warnings),
    )
