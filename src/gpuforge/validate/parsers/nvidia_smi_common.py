"""The typed GPU record shared by the ``nvidia-smi -q`` text and ``-q -x`` XML parsers.

Every field that nvidia-smi may print as ``N/A`` is optional: None means the tool did not report
it, never zero. ``fields`` keeps every raw value by its path, for checks that need more.

Each parser reads its format into ``fields`` (paths of keys, or of XML elements) and names where
each value stands in a :class:`FieldPaths`; :func:`gpu_info` lifts one GPU's values the same way
for both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
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


def first(fields: Mapping[str, str], *paths: str) -> str | None:
    """The value at the first of ``paths`` that is present."""
    for path in paths:
        if path in fields:
            return fields[path]
    return None


@dataclass(frozen=True, slots=True)
class FieldPaths:
    """Where one format puts each value :class:`GpuInfo` holds, as paths of ``fields``.

    A tuple names alternatives, the first present wins (names that changed between drivers);
    ``{power}`` stands for the power section (``power_sections``: the first present), ``{scope}``
    for the ECC scope (``ecc_scopes``: volatile, aggregate).
    """

    product_name: str
    architecture: str
    serial: str
    uuid: str
    minor_number: str
    vbios_version: str
    persistence_mode: str
    mig_mode: str
    pcie_gen_current: str
    pcie_gen_max: str
    pcie_width_current: str
    pcie_width_max: str
    temperature_c: str
    power_sections: tuple[str, ...]
    power_draw_w: tuple[str, ...]
    power_limit_w: tuple[str, ...]
    memory_total_mib: str
    memory_used_mib: str
    ecc_mode: str
    ecc_scopes: tuple[str, str]
    ecc_base: str
    sram_correctable: str
    sram_uncorrectable: tuple[str, ...]
    dram_correctable: str
    dram_uncorrectable: str
    retired_pages_sbe: str
    retired_pages_dbe: str
    retired_pages_pending: str
    remapped_base: str
    remapped_correctable: str
    remapped_uncorrectable: str
    remapped_pending: str
    remapped_failure: str
    fabric_state: str
    fabric_status: str


def _ecc(fields: Mapping[str, str], paths: FieldPaths, scope: str) -> EccCounters | None:
    base = paths.ecc_base.format(scope=scope)
    if not any(k.startswith(base + "/") for k in fields):
        return None
    return EccCounters(
        sram_correctable=integer(fields.get(f"{base}/{paths.sram_correctable}")),
        sram_uncorrectable=sum_optional(
            *(integer(fields.get(f"{base}/{leaf}")) for leaf in paths.sram_uncorrectable)
        ),
        dram_correctable=integer(fields.get(f"{base}/{paths.dram_correctable}")),
        dram_uncorrectable=integer(fields.get(f"{base}/{paths.dram_uncorrectable}")),
    )


def _remapped(
    fields: Mapping[str, str], paths: FieldPaths, histogram: Mapping[str, int]
) -> RemappedRows | None:
    base = paths.remapped_base
    if not any(k.startswith(base + "/") for k in fields):
        return None  # not reported (MIG, or a GPU without row remapping)
    return RemappedRows(
        correctable=integer(fields.get(f"{base}/{paths.remapped_correctable}")),
        uncorrectable=integer(fields.get(f"{base}/{paths.remapped_uncorrectable}")),
        pending=yes_no(fields.get(f"{base}/{paths.remapped_pending}")),
        failure_occurred=yes_no(fields.get(f"{base}/{paths.remapped_failure}")),
        bank_availability=dict(histogram),
    )


def gpu_info(
    bus_id: str | None,
    fields: dict[str, str],
    paths: FieldPaths,
    *,
    histogram: Callable[[Mapping[str, str]], Mapping[str, int]],
    event_reasons: Callable[[Mapping[str, str]], tuple[str, ...]],
) -> GpuInfo:
    """One GPU's :class:`GpuInfo` from its ``fields``, read where ``paths`` says; the remapping
    histogram and the active clock event reasons are laid out apart in each format."""
    power = next(
        (p for p in paths.power_sections if any(k.startswith(p + "/") for k in fields)),
        paths.power_sections[-1],
    )
    scopes = paths.ecc_scopes
    return GpuInfo(
        pci_bus_id=bus_id,
        product_name=reported(fields.get(paths.product_name)),
        architecture=reported(fields.get(paths.architecture)),
        serial=reported(fields.get(paths.serial)),
        uuid=reported(fields.get(paths.uuid)),
        minor_number=integer(fields.get(paths.minor_number)),
        vbios_version=reported(fields.get(paths.vbios_version)),
        persistence_mode=reported(fields.get(paths.persistence_mode)),
        mig_mode=reported(fields.get(paths.mig_mode)),
        pcie_gen_current=integer(fields.get(paths.pcie_gen_current)),
        pcie_gen_max=integer(fields.get(paths.pcie_gen_max)),
        pcie_width_current=integer(fields.get(paths.pcie_width_current)),
        pcie_width_max=integer(fields.get(paths.pcie_width_max)),
        temperature_c=number(fields.get(paths.temperature_c)),
        power_draw_w=number(first(fields, *(f"{power}/{p}" for p in paths.power_draw_w))),
        power_limit_w=number(first(fields, *(f"{power}/{p}" for p in paths.power_limit_w))),
        memory_total_mib=integer(fields.get(paths.memory_total_mib)),
        memory_used_mib=integer(fields.get(paths.memory_used_mib)),
        ecc_mode=reported(fields.get(paths.ecc_mode)),
        ecc_volatile=_ecc(fields, paths, scopes[0]),
        ecc_aggregate=_ecc(fields, paths, scopes[1]),
        retired_pages_sbe=integer(fields.get(paths.retired_pages_sbe)),
        retired_pages_dbe=integer(fields.get(paths.retired_pages_dbe)),
        retired_pages_pending=yes_no(fields.get(paths.retired_pages_pending)),
        remapped_rows=_remapped(fields, paths, histogram(fields)),
        fabric_state=reported(fields.get(paths.fabric_state)),
        fabric_status=reported(fields.get(paths.fabric_status)),
        clocks_event_reasons_active=event_reasons(fields),
        fields=fields,
    )
