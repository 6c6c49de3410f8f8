"""Simulated DCGM ``dcgmi`` (diag -r 1|2|3 [-j], discovery -l, --version) and ``nv-hostengine``.

Output follows the DCGM 3.x table and JSON layouts of the real captures (awsome p4de, A10G
targeted-power failure, VirtualClient -j); DCGM 4 prints the same sections for these levels.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field

from . import SIM_BANNER
from .gpu import GpuHealth, gpu_health, throttled
from .state import (
    DCGM_PACKAGE,
    Lab,
    NodeView,
    SimError,
    driver_version,
    installed_version,
    load_lab,
    upstream_version,
)

FATAL_XIDS = {48, 63, 64, 74, 79, 94, 95, 119}


@dataclass
class Result:
    status: str  # Pass / Fail / Skip / Warn
    gpu_ids: list[int] | None = None  # None: not a per-GPU test
    info: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass
class Test:
    name: str
    results: list[Result]


def _per_gpu(
    gpus: list[GpuHealth], fails: dict[int, str], infos: dict[int, str] | None = None
) -> list[Result]:
    out = []
    for g in gpus:
        msg = fails.get(g.index)
        out.append(
            Result(
                "Fail" if msg else "Pass",
                [g.index],
                (infos or {}).get(g.index, ""),
                [msg] if msg else [],
            )
        )
    return out


def run_diag(node: NodeView, level: int) -> list[tuple[str, list[Test]]]:  # noqa: PLR0912
    gpus = gpu_health(node)
    fm_down = node.has("fabricmanager_down") and bool(node.sku and node.sku.nvswitch)
    remap: list[str] = []
    for g in gpus:
        if g.remap_pending:
            remap.append(
                f"GPU {g.index} has uncorrectable memory errors and row remappings are pending"
            )
        if g.remap_failure:
            remap.append(f"GPU {g.index} had a row remapping failure.")
    deployment = [
        Test("Denylist", [Result("Pass")]),
        Test("NVML Library", [Result("Pass")]),
        Test(
            "CUDA Main Library",
            [
                Result(
                    "Fail",
                    warnings=["Error using CUDA API cuInit: system not yet initialized"],
                )
                if fm_down
                else Result("Pass")
            ],
        ),
        Test("Permissions and OS Blocks", [Result("Pass")]),
        Test("Persistence Mode", [Result("Pass")]),
        Test("Environment Variables", [Result("Pass")]),
        Test(
            "Page Retirement/Row Remap",
            [Result("Fail", warnings=remap) if remap else Result("Pass")],
        ),
        Test("Graphics Processes", [Result("Pass")]),
        Test("Inforom", [Result("Pass")]),
    ]
    cats: list[tuple[str, list[Test]]] = [("Deployment", deployment)]
    if level < 2:
        return cats
    if fm_down or remap:
        # DCGM stops after a failing deployment check; the later plugins do not run.
        return cats
    pcie_fail: dict[int, str] = {}
    for g in gpus:
        if g.nvlinks_down:
            link = min(g.nvlinks_down)
            pcie_fail[g.index] = f"GPU {g.index}'s NvLink link {link} is currently down"
        elif g.pcie_gen < g.sku.pcie_gen:
            pcie_fail[g.index] = (
                f"GPU {g.index} is running at PCI link generation {g.pcie_gen}, which is below "
                f"the minimum allowed link generation of {g.sku.pcie_gen} (parameter "
                "'pcie.min_pci_generation')"
            )
        elif g.pcie_width < 16:
            pcie_fail[g.index] = (
                f"GPU {g.index} is running at PCI link width {g.pcie_width}X, which is below the "
                "minimum allowed link width of 16 (parameter 'pcie.min_pci_width')"
            )
    mem_fail: dict[int, str] = {}
    xids = {
        (f["gpu"], f["code"]) for f in node.faults if f["kind"] == "xid" and f["code"] in FATAL_XIDS
    }
    phys_to_index = {g.physical: g.index for g in gpus}
    for g in gpus:
        if g.dram_uncorrectable and not g.remap_pending:
            mem_fail[g.index] = (
                f"Detected {g.dram_uncorrectable} volatile double-bit ECC error(s) in "
                f"GPU {g.index}."
            )
    for phys, code in sorted(xids):
        if phys in phys_to_index:
            mem_fail.setdefault(
                phys_to_index[phys], f"Detected XID {code} for GPU {phys_to_index[phys]}"
            )
    integration = [Test("PCIe", _per_gpu(gpus, pcie_fail))]
    hardware = [Test("GPU Memory", _per_gpu(gpus, mem_fail))]
    stress: list[Test] = []
    if level >= 3:
        diag_fail = {
            g.index: f"Found 12 faulty memory elements on GPU {g.index}"
            for g in gpus
            if g.burn_faulty
        }
        hardware.append(Test("Diagnostic", _per_gpu(gpus, diag_fail)))
        stress_fail = {
            g.index: (
                f"Detected clocks event due to thermal violation in GPU {g.index}: "
                "clocks_event_reason_hw_thermal_slowdown"
            )
            for g in gpus
            if throttled(g)
        }
        stress.append(Test("Targeted Stress", _per_gpu(gpus, stress_fail)))
        power_fail = {
            g.index: (
                f"GPU {g.index} Max power of {g.sku.power_limit_w * 0.8:.1f} did not reach "
                f"desired power minimum target_power_min_ratio of "
                f"{g.sku.power_limit_w * 0.95:.1f} for GPU {g.index}"
            )
            for g in gpus
            if g.reasons.get("sw_power_cap") or g.reasons.get("hw_power_brake_slowdown")
        }
        stress.append(Test("Targeted Power", _per_gpu(gpus, power_fail)))
        bw_fail: dict[int, str] = {}
        for g in gpus:
            if g.hbm_factor < 1.0:
                got = g.sku.hbm_gbps * g.hbm_factor
                need = g.sku.hbm_gbps * 0.9
                bw_fail[g.index] = (
                    f"GPU {g.index} only achieved a memory bandwidth of {got:.2f} GB/s, failing to "
                    f"meet {need:.2f} GB/s for test 0"
                )
        stress.append(Test("Memory Bandwidth", _per_gpu(gpus, bw_fail)))
        hardware.append(Test("EUD Test", [Result("Skip", [g.index]) for g in gpus]))
    cats += [("Integration", integration), ("Hardware", hardware), ("Stress", stress)]
    return cats


def _wrap(text: str, width: int = 45) -> list[str]:
    return [text[i : i + width] for i in range(0, len(text), width)] or [""]


def _row(name: str, value: str) -> list[str]:
    lines = []
    for i, chunk in enumerate(_wrap(value)):
        lines.append(f"| {(name if i == 0 else ''):<25} | {chunk:<46} |")
    return lines


def _summary(results: list[Result]) -> list[str]:
    if all(r.gpu_ids is None for r in results):
        return [results[0].status]
    by: dict[str, list[int]] = {}
    for r in results:
        by.setdefault(r.status, []).extend(r.gpu_ids or [])
    if len(by) == 1:
        return [f"{next(iter(by))} - All"]
    out = []
    for status in ("Pass", "Fail", "Warn", "Skip"):
        ids = by.get(status)
        if ids:
            noun = "GPU" if len(ids) == 1 else "GPUs"
            out.append(f"{status} - {noun}: {', '.join(str(i) for i in ids)}")
    return out


def _sep(name: str, edge: str) -> str:
    return edge + f"-----  {name}  ".ljust(27, "-") + "+" + "-" * 48 + edge


def render_table(cats: list[tuple[str, list[Test]]], dcgm: str, driver: str, ids: str) -> str:
    border = "+---------------------------+------------------------------------------------+"
    out = [
        "Successfully ran diagnostic for group.",
        border,
        "| Diagnostic                | Result                                         |",
        "+===========================+================================================+",
        _sep("Metadata", "|"),
        *_row("DCGM Version", dcgm),
        *_row("Driver Version Detected", driver),
        *_row("GPU Device IDs Detected", ids),
    ]
    for cat, tests in cats:
        out.append(_sep(cat, "|" if cat == "Deployment" else "+"))
        for t in tests:
            for i, line in enumerate(_summary(t.results)):
                out += _row(t.name if i == 0 else "", line)
            for r in t.results:
                for w in r.warnings:
                    out += _row("Warning" if r.gpu_ids is not None else "Error", w)
    out.append(border)
    return "\n".join(out)


def render_json(cats: list[tuple[str, list[Test]]], dcgm: str, driver: str, ids: str) -> str:
    categories = []
    for cat, tests in cats:
        jt = []
        for t in tests:
            results = []
            for r in t.results:
                item: dict[str, object] = {}
                if r.gpu_ids is not None:
                    item["gpu_ids"] = ",".join(str(i) for i in r.gpu_ids)
                if r.info:
                    item["info"] = r.info
                item["status"] = r.status
                if r.warnings:
                    item["warnings"] = [
                        {"error_category": 1, "error_id": 1, "error_severity": 2, "warning": w}
                        for w in r.warnings
                    ]
                results.append(item)
            jt.append({"name": t.name, "results": results})
        categories.append({"category": cat, "tests": jt})
    doc = {
        "DCGM GPU Diagnostic": {"test_categories": categories},
        "Driver Version Detected": driver,
        "GPU Device IDs": ids.split(",") if ids else [],
        "version": dcgm,
    }
    return json.dumps(doc, indent="\t", separators=(",", " : "))


def dcgm_version() -> str:
    v = installed_version(DCGM_PACKAGE)
    return upstream_version(v) if v else "4.2.3"


def cmd_discovery(lab: Lab) -> int:
    gpus = gpu_health(lab.local())
    driver_version()
    bar = "+--------+----------------------------------------------------------------------+"
    out = [f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} found.", bar]
    out.append("| GPU ID | Device Information                                                   |")
    out.append(bar)
    for g in gpus:
        out.append(f"| {g.index:<6} | {'Name: ' + g.sku.product_name:<68} |")
        out.append(f"|        | {'PCI Bus ID: ' + g.bus_id:<68} |")
        out.append(f"|        | {'Device UUID: ' + g.uuid:<68} |")
        out.append(bar)
    out.append("0 NvSwitches found.")
    out.append("+-----------+")
    out.append("| Switch ID |")
    out.append("+-----------+")
    out.append("+-----------+")
    print("\n".join(out))
    return 0


def main(argv: list[str]) -> int:
    if "--version" in argv or argv[:1] == ["-v"]:
        print(f"dcgmi  version: {dcgm_version()}")
        print(f"({SIM_BANNER})")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "Usage: dcgmi <subsystem>\n  diag       -r <1|2|3> [-j]   Run diagnostics\n"
            f"  discovery  -l               List GPUs\n\n({SIM_BANNER})"
        )
        return 0 if argv else 1
    lab = load_lab()
    if argv[0] == "discovery":
        return cmd_discovery(lab)
    if argv[0] != "diag":
        raise SimError(f"Error: subsystem {argv[0]!r} is not simulated.", rc=2)
    level = 1
    as_json = False
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-r", "--run") and i + 1 < len(argv):
            token = argv[i + 1]
            level = {"short": 1, "medium": 2, "long": 3, "xlong": 4}.get(token, 0) or int(token)
            i += 1
        elif a in ("-j", "--json"):
            as_json = True
        i += 1
    if level not in (1, 2, 3, 4):
        raise SimError(f"Error: Invalid run level {level}.", rc=2)
    driver = driver_version()
    node = lab.local()
    cats = run_diag(node, min(level, 3))
    gpus = gpu_health(node)
    ids = ",".join(g.sku.pci_short_id for g in gpus)
    lab.sleep({1: 5.0, 2: 90.0, 3: 600.0}[min(level, 3)])
    text = (
        render_json(cats, dcgm_version(), driver, ids)
        if as_json
        else render_table(cats, dcgm_version(), driver, ids)
    )
    print(text)
    failed = any(r.status == "Fail" for _c, tests in cats for t in tests for r in t.results)
    return 1 if failed else 0


def hostengine_main(argv: list[str]) -> int:
    """nv-hostengine: stay in the foreground until stopped (the simulated dcgmi needs no socket)."""
    if "--version" in argv:
        print(f"nv-hostengine version {dcgm_version()} ({SIM_BANNER})")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    print(f"Started host engine version {dcgm_version()} using port number: 5555 ({SIM_BANNER})")
    while True:
        time.sleep(3600)
