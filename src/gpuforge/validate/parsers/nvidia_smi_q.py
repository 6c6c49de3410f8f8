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
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    require_text,
    split_lines,
)
from gpuforge.validate.parsers.nvidia_smi_common import (
    FieldPaths,
    GpuInfo,
    NvidiaSmiReport,
    gpu_info,
    integer,
    reported,
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


#: Where ``-q`` text puts each value (``A/B/C`` paths of its indented keys).
PATHS = FieldPaths(
    product_name="Product Name",
    architecture="Product Architecture",
    serial="Serial Number",
    uuid="GPU UUID",
    minor_number="Minor Number",
    vbios_version="VBIOS Version",
    persistence_mode="Persistence Mode",
    mig_mode="MIG Mode/Current",
    pcie_gen_current="PCI/GPU Link Info/PCIe Generation/Current",
    pcie_gen_max="PCI/GPU Link Info/PCIe Generation/Max",
    pcie_width_current="PCI/GPU Link Info/Link Width/Current",
    pcie_width_max="PCI/GPU Link Info/Link Width/Max",
    temperature_c="Temperature/GPU Current Temp",
    power_sections=("GPU Power Readings", "Power Readings"),
    power_draw_w=("Power Draw", "Instantaneous Power Draw"),
    power_limit_w=("Current Power Limit", "Power Limit"),
    memory_total_mib="FB Memory Usage/Total",
    memory_used_mib="FB Memory Usage/Used",
    ecc_mode="ECC Mode/Current",
    ecc_scopes=("Volatile", "Aggregate"),
    ecc_base="ECC Errors/{scope}",
    sram_correctable="SRAM Correctable",
    sram_uncorrectable=(
        "SRAM Uncorrectable",
        "SRAM Uncorrectable Parity",
        "SRAM Uncorrectable SEC-DED",
    ),
    dram_correctable="DRAM Correctable",
    dram_uncorrectable="DRAM Uncorrectable",
    retired_pages_sbe="Retired Pages/Single Bit ECC",
    retired_pages_dbe="Retired Pages/Double Bit ECC",
    retired_pages_pending="Retired Pages/Pending Page Blacklist",
    remapped_base="Remapped Rows",
    remapped_correctable="Correctable Error",
    remapped_uncorrectable="Uncorrectable Error",
    remapped_pending="Pending",
    remapped_failure="Remapping Failure Occurred",
    fabric_state="Fabric/State",
    fabric_status="Fabric/Status",
)
_HISTOGRAM = "Remapped Rows/Bank Remap Availability Histogram/"


def _histogram(fields: Mapping[str, str]) -> dict[str, int]:
    return {
        k.removeprefix(_HISTOGRAM): value
        for k, v in fields.items()
        if k.startswith(_HISTOGRAM) and (value := integer(v)) is not None
    }


def _event_reasons(fields: Mapping[str, str]) -> tuple[str, ...]:
    active = []
    for path, value in fields.items():
        head, _, name = path.rpartition("/")
        top = head.split("/", 1)[0]
        if top in ("Clocks Event Reasons", "Clocks Throttle Reasons") and value == "Active":
            active.append(name)
    return tuple(active)


def gpu_from_fields(bus_id: str | None, fields: dict[str, str]) -> GpuInfo:
    """Lift the values health checks use out of one GPU's ``-q`` fields."""
    return gpu_info(bus_id, fields, PATHS, histogram=_histogram, event_reasons=_event_reasons)


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
