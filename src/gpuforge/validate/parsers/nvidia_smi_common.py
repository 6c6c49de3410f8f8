"""The typed GPU record shared by the ``nvidia-smi -q`` text and ``-q -x`` XML parsers.

Every field that nvidia-smi may print as ``N/A`` is optional: None means the tool did not report
it, never zero. ``fields`` keeps every raw value by its path, for checks that need more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NOT_REPORTED = {"n/a", "[n/a]", "not supported", "[not supported]", "unknown", ""}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


@dataclass(frozen=True, slots=True)
class EccCounters:
    """ECC error counts of one scope (volatile or aggregate)."""

    sram_correctable: int | None
    sram_uncorrectable: int | None
    """Sum of parity and SEC-DED on drivers that split them (535+ on Hopper)."""
    dram_correctable: int | None
    dram_uncorrectable: int | None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row-remapping state (A100 and later)."""

    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure_occurred: bool | None
    bank_availability: dict[str, int]
    """Histogram ``Max``/``High``/``Partial``/``Low``/``None`` → banks."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of an ``nvidia-smi -q`` report."""

    pci_bus_id: str | None
    """None only for a fragment that lacks the ``GPU <bus id>`` header."""
    product_name: str | None
    architecture: str | None
    serial: str | None
    uuid: str | None
    minor_number: int | None
    vbios_version: str | None
    persistence_mode: str | None
    mig_mode: str | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    temperature_c: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    ecc_mode: str | None
    ecc_volatile: EccCounters | None
    ecc_aggregate: EccCounters | None
    retired_pages_sbe: int | None
    retired_pages_dbe: int | None
    retired_pages_pending: bool | None
    remapped_rows: RemappedRows | None
    fabric_state: str | None
    fabric_status: str | None
    clocks_event_reasons_active: tuple[str, ...]
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class NvidiaSmiReport:
    """A whole ``nvidia-smi -q`` (or ``-q -x``) report."""

    timestamp: str | None
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[GpuInfo, ...]
    warnings: tuple[str, ...]


def reported(value: str | None) -> str | None:
    """The value, or None when nvidia-smi says it is not available."""
    if value is None:
        return None
    value = value.strip()
    return None if value.lower() in _NOT_REPORTED else value


def number(value: str | None) -> float | None:
    """The leading number of ``"67.74 W"``, ``"16x"``, ``"29 C"``; None when not reported."""
    value = reported(value)
    if value is None:
        return None
    match = _NUMBER.match(value)
    return float(match[1]) if match else None


def integer(value: str | None) -> int | None:
    """Like :func:`number`, as an int."""
    result = number(value)
    return None if result is None else int(result)


def yes_no(value: str | None) -> bool | None:
    """``Yes``/``No`` → bool; None when not reported."""
    value = reported(value)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "true"):
        return True
    if lowered in ("no", "false"):
        return False
    return None


def sum_optional(*values: int | None) -> int | None:
    """Sum of the reported values; None when none is reported."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None
