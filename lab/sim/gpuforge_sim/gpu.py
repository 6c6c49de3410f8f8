"""Per-GPU health as the driver would report it: one place that turns faults into values."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import lifecycle
from .counters import ecc_degrading
from .skus import Sku
from .state import NodeView

# clocks_event_reasons bit values (nvml.h nvmlClocksEventReason*).
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass
class GpuHealth:
    index: int  # index as the tools number it (visible GPUs only)
    physical: int  # position on the board / minor number
    sku: Sku
    bus: int
    uuid: str
    serial: str
    pcie_gen: int
    pcie_width: int
    temp_c: int
    mem_temp_c: int
    power_w: float
    graphics_mhz: int
    reasons: dict[str, bool] = field(default_factory=dict)
    dram_uncorrectable: int = 0
    dram_correctable: int = 0
    remap_corr: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    reset_required: bool = False
    nvlinks_down: set[int] = field(default_factory=set)
    hbm_factor: float = 1.0
    burn_faulty: bool = False
    app_graphics_mhz: int = 0  # applications (locked) graphics clock; 0 = the SKU's maximum
    compute_factor: float = 1.0  # share of the SKU's compute this GPU delivers

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def reasons_mask(self) -> int:
        return sum(REASON_BITS[k] for k, v in self.reasons.items() if v)

    @property
    def nvlinks_up(self) -> int:
        return self.sku.nvlinks - len(self.nvlinks_down)

    def histogram(self) -> tuple[int, int, int, int, int]:
        """Row remapper bank histogram: max, high, partial, low, none."""
        if self.remap_failure:
            return (self.sku.remap_banks - 1, 0, 0, 0, 1)
        if self.remap_corr or self.remap_unc:
            return (self.sku.remap_banks - 1, 1, 0, 0, 0)
        return (self.sku.remap_banks, 0, 0, 0, 0)


def gpu_health(node: NodeView) -> list[GpuHealth]:  # noqa: PLR0912, PLR0915 - one branch per fault kind
    """Visible GPUs of ``node`` with every fault applied."""
    sku = node.sku
    if sku is None:
        return []
    out: list[GpuHealth] = []
    boot, at = lifecycle.boot_time(), lifecycle.now()
    for index, phys in enumerate(node.visible_gpus()):
        rng = node.rng("gpu", phys)
        idle_temp = 27 + rng.randint(0, 6)
        g = GpuHealth(
            index=index,
            physical=phys,
            sku=sku,
            bus=node.bus_id(phys),
            uuid=node.uuid(phys),
            serial=node.serial(phys),
            pcie_gen=sku.pcie_gen,
            pcie_width=16,
            temp_c=idle_temp,
            mem_temp_c=idle_temp + 9,
            power_w=round(sku.power_limit_w * 0.1 + rng.uniform(-3, 3), 2),
            graphics_mhz=sku.max_graphics_mhz,
            reasons=dict.fromkeys(REASON_BITS, False),
        )
        for f in node.gpu_faults(phys):
            kind = f["kind"]
            if kind == "ecc_uncorrectable":
                g.dram_uncorrectable += int(f.get("count", 2))
                g.remap_unc += int(f.get("count", 2))
            elif kind == "row_remap_pending":
                g.dram_uncorrectable += 1
                g.remap_unc += 1
                g.remap_pending = True
                g.reset_required = True
            elif kind == "row_remap_failure":
                g.dram_uncorrectable += 1
                g.remap_failure = True
            elif kind == "throttle":
                reason = f.get("reason", "thermal")
                if reason == "thermal":
                    g.reasons["hw_slowdown"] = True
                    g.reasons["hw_thermal_slowdown"] = True
                    g.temp_c = 91
                    g.mem_temp_c = 88
                elif reason == "sw_thermal":
                    g.reasons["sw_thermal_slowdown"] = True
                    g.temp_c = 87
                    g.mem_temp_c = 85
                elif reason == "power":
                    g.reasons["sw_power_cap"] = True
                    g.power_w = sku.power_limit_w - 2.1
                else:
                    g.reasons["hw_slowdown"] = True
                    g.reasons["hw_power_brake_slowdown"] = True
                g.graphics_mhz = int(sku.max_graphics_mhz * 0.55) // 15 * 15
            elif kind == "pcie_downtrained":
                g.pcie_gen = int(f.get("gen", 4))
                g.pcie_width = int(f.get("width", 8))
            elif kind == "hbm_degraded":
                g.hbm_factor = min(g.hbm_factor, float(f.get("factor", 0.7)))
            elif kind == "burn_faulty":
                g.burn_faulty = True
            elif kind == "ecc_degrading":
                errors, rows = ecc_degrading(f, boot, at)
                g.dram_correctable += errors
                g.remap_corr += rows
            elif kind == "clocks_locked":
                # `nvidia-smi -ac`/`-lgc` below the maximum: no fault reason, just slower
                factor = float(f.get("factor", 0.63))
                g.app_graphics_mhz = int(sku.max_graphics_mhz * factor) // 15 * 15
                g.graphics_mhz = min(g.graphics_mhz, g.app_graphics_mhz)
                g.reasons["applications_clocks_setting"] = True
                g.compute_factor = min(g.compute_factor, factor)
        for f in node.faults:
            if f["kind"] == "power_high":
                # a GPU working flat out: draw near the limit (rack power over its budget)
                g.power_w = round(sku.power_limit_w * float(f.get("load", 0.98)), 2)
                g.temp_c = max(g.temp_c, 71)
                g.mem_temp_c = max(g.mem_temp_c, 79)
        g.nvlinks_down = node.nvlinks_down(phys)
        out.append(g)
    return out


def throttled(g: GpuHealth) -> bool:
    return any(
        g.reasons[k]
        for k in ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown")
    )
