"""Simulated ``dcgm-exporter``: NVIDIA's Prometheus exporter, from the node's fault state.

``dcgm-exporter [-f COUNTERS.csv] [-a ADDR:PORT]`` serves ``/metrics`` (default ``:9400``) with
dcgm-exporter's metric names (the DCGM field names of the counters file), types and help texts,
and its labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` and
``DCGM_FI_DRIVER_VERSION``. The counters file has dcgm-exporter's format
(``DCGM FIELD, Prometheus metric type, help message``; ``#`` comments). Values are computed at
every scrape from the same per-GPU health ``nvidia-smi`` prints, so a fault loaded into a running
lab shows at the next scrape, a GPU that fell off the bus has no series, and a cleared fault's
values return to normal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import SIM_BANNER, lifecycle
from .gpu import GpuHealth, gpu_health
from .kmsg import XID_KINDS
from .state import NodeView, SimError, driver_version, load_lab

DEFAULT_COUNTERS = Path("/etc/dcgm-exporter/default-counters.csv")
DEFAULT_ADDRESS = ":9400"
VERSION = "4.1.3-4.2.3"  # dcgm-exporter release - DCGM version, as its --version prints them

Value = Callable[["Sample"], float]


class Context:
    """What a scrape needs besides one GPU's health: the node, its uptime, its Xids."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.uptime = lifecycle.uptime()
        self.last_xid: dict[int, int] = {}
        codes = {"ecc_uncorrectable": 48, "row_remap_pending": 63, "row_remap_failure": 64}
        codes["nvlink_down"] = 74
        for f in sorted(node.faults, key=lifecycle.injected_at):
            if f["kind"] in XID_KINDS:
                self.last_xid[int(f["gpu"])] = int(codes.get(f["kind"], f.get("code", 0)))
            elif f["kind"] == "gpu_missing":
                self.last_xid[int(f["gpu"])] = 79

    def throttled_us(self, g: GpuHealth, *reasons: str) -> float:
        """Microseconds spent throttled for ``reasons`` since boot (the fault's whole life)."""
        if not any(g.reasons.get(r) for r in reasons):
            return 0.0
        started = [
            lifecycle.elapsed(f, lifecycle.boot_time(), lifecycle.now())
            for f in self.node.gpu_faults(g.physical, "throttle")
        ]
        return max(started, default=self.uptime) * 1e6


def _used_mib(_g: GpuHealth) -> float:
    return 0.0  # no process holds GPU memory in the lab


@dataclass
class Sample:
    """One GPU of one scrape."""

    g: GpuHealth
    c: Context


#: DCGM field name -> value of one GPU. Field names as dcgm-exporter exports them.
FIELDS: dict[str, Value] = {
    "DCGM_FI_DEV_SM_CLOCK": lambda s: s.g.graphics_mhz,
    "DCGM_FI_DEV_MEM_CLOCK": lambda s: s.g.sku.max_memory_mhz,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda s: s.g.mem_temp_c,
    "DCGM_FI_DEV_GPU_TEMP": lambda s: s.g.temp_c,
    "DCGM_FI_DEV_POWER_USAGE": lambda s: s.g.power_w,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda s: int(s.g.power_w * s.c.uptime * 1000),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": lambda s: int(s.c.uptime * 12),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": lambda s: int(s.c.uptime * 15),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda _s: 0,
    "DCGM_FI_DEV_GPU_UTIL": lambda _s: 0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda _s: 0,
    "DCGM_FI_DEV_ENC_UTIL": lambda _s: 0,
    "DCGM_FI_DEV_DEC_UTIL": lambda _s: 0,
    "DCGM_FI_DEV_XID_ERRORS": lambda s: s.c.last_xid.get(s.g.physical, 0),
    "DCGM_FI_DEV_POWER_VIOLATION": lambda s: int(
        s.c.throttled_us(s.g, "sw_power_cap", "hw_power_brake_slowdown")
    ),
    "DCGM_FI_DEV_THERMAL_VIOLATION": lambda s: int(
        s.c.throttled_us(s.g, "hw_thermal_slowdown", "sw_thermal_slowdown")
    ),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": lambda _s: 0,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": lambda _s: 0,
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": lambda _s: 0,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": lambda _s: 0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda s: s.g.reasons_mask,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda s: s.g.reasons_mask,
    "DCGM_FI_DEV_FB_FREE": lambda s: (
        s.g.sku.fb_total_mib - s.g.sku.fb_reserved_mib - _used_mib(s.g)
    ),
    "DCGM_FI_DEV_FB_USED": lambda s: _used_mib(s.g),
    "DCGM_FI_DEV_FB_RESERVED": lambda s: s.g.sku.fb_reserved_mib,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda s: s.g.dram_correctable,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda s: s.g.dram_uncorrectable,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda s: s.g.dram_correctable,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": lambda s: s.g.dram_uncorrectable,
    "DCGM_FI_DEV_RETIRED_SBE": lambda _s: 0,
    "DCGM_FI_DEV_RETIRED_DBE": lambda _s: 0,
    "DCGM_FI_DEV_RETIRED_PENDING": lambda _s: 0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda s: s.g.remap_unc,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda s: s.g.remap_corr,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda s: int(s.g.remap_failure),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda s: int(s.g.remap_pending),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": lambda _s: 0,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": lambda _s: 0,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": lambda _s: 0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": lambda s: len(s.g.nvlinks_down),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda s: (
        0 if s.g.nvlinks_up == 0 else int(s.c.uptime * 1000 * s.g.nvlinks_up)
    ),
}

#: The counters file the package installs: dcgm-exporter's default fields plus the ECC,
#: row-remap, NVLink error and clock-event fields gpuforge's alert rules read.
COUNTERS_CSV = """# Format
# If line starts with a '#' it is considered a comment
# DCGM FIELD, Prometheus metric type, help message
# (gpuforge lab simulator, not NVIDIA software)

# Clocks
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).

# Temperature
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).

# Power
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).

# PCIE
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.

# Utilization
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).

# Errors and violations
DCGM_FI_DEV_XID_ERRORS,          gauge,   Value of the last XID error encountered.
DCGM_FI_DEV_POWER_VIOLATION,     counter, Throttling duration due to power constraints (in us).
DCGM_FI_DEV_THERMAL_VIOLATION,   counter, Throttling duration due to thermal constraints (in us).
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, Current clock throttle reasons (bitmask).

# Memory usage
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).

# ECC
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.

# NVLink
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,   counter, Total number of NVLink retries.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total NVLink bandwidth counters, all lanes

# Remapped rows
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed
DCGM_FI_DEV_ROW_REMAP_PENDING,           gauge,   Whether remapping of rows is pending
"""


def parse_counters(text: str, source: str = "counters") -> list[tuple[str, str, str]]:
    """``(field, type, help)`` rows of a dcgm-exporter counters file.

    Raises:
        SimError: a row without three fields, a type other than gauge/counter, or a field the
            simulator does not know (dcgm-exporter refuses unknown fields too).
    """
    rows: list[tuple[str, str, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3:
            raise SimError(f"{source}:{n}: expected 'FIELD, type, help', got {line!r}", rc=1)
        field, kind, text_help = parts
        if kind not in ("gauge", "counter"):
            raise SimError(f"{source}:{n}: metric type must be gauge or counter: {kind!r}", rc=1)
        if field not in FIELDS:
            raise SimError(f"{source}:{n}: could not find DCGM field {field!r}", rc=1)
        rows.append((field, kind, text_help))
    return rows


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def render(rows: list[tuple[str, str, str]]) -> str:
    """The ``/metrics`` text of this node now."""
    node = load_lab().local()
    try:
        driver = driver_version()
    except SimError:
        return ""  # no driver: DCGM sees no GPU, the exporter exports nothing
    ctx = Context(node)
    gpus = gpu_health(node)
    out: list[str] = []
    for field, kind, text_help in rows:
        out.append(f"# HELP {field} {text_help}")
        out.append(f"# TYPE {field} {kind}")
        for g in gpus:
            labels = (
                f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.bus_id}",'
                f'device="nvidia{g.physical}",modelName="{_esc(g.sku.product_name)}",'
                f'Hostname="{_esc(node.hostname)}",DCGM_FI_DRIVER_VERSION="{driver}"'
            )
            out.append(f"{field}{{{labels}}} {_number(FIELDS[field](Sample(g, ctx)))}")
    return "\n".join(out) + "\n"


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    try:
        return host, int(port)
    except ValueError as exc:
        raise SimError(f"dcgm-exporter: invalid address {value!r} (want [HOST]:PORT)", 2) from exc


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dcgm-exporter")
    parser.add_argument("-f", "--collectors", type=Path, default=DEFAULT_COUNTERS)
    parser.add_argument("-a", "--address", default=DEFAULT_ADDRESS)
    parser.add_argument("-c", "--collect-interval", type=int, default=30000)
    parser.add_argument("-v", "--version", action="store_true")
    parser.add_argument("--once", action="store_true", help="print /metrics once and exit")
    args = parser.parse_args(argv)
    if args.version:
        print(f"dcgm-exporter version {VERSION} ({SIM_BANNER})")
        return 0
    try:
        text = args.collectors.read_text()
    except OSError as exc:
        raise SimError(f"dcgm-exporter: cannot read {args.collectors}: {exc.strerror}", 1) from exc
    rows = parse_counters(text, str(args.collectors))
    if args.once:
        print(render(rows), end="")
        return 0
    host, port = _address(args.address)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/health":
                body, status = b"OK\n", 200
            elif self.path.split("?")[0] == "/metrics":
                try:
                    body, status = render(rows).encode(), 200
                except SimError as err:
                    body, status = (err.message + "\n").encode(), 500
            else:
                body, status = b"404 page not found\n", 404
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    print(f"Starting webserver on {args.address} ({SIM_BANNER})", file=sys.stderr)
    sys.stderr.flush()
    with ThreadingHTTPServer((host, port), Handler) as server:
        server.serve_forever()
    return 0
