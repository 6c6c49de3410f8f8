"""Per-SKU constants and healthy performance baselines, with the public figures they come from.

What every layer knows of a GPU model (its names, product name, architecture, board power, PCIe
generation) is gpuforge's SKU catalogue, ``src/gpuforge/topology/data/skus.json``; the rest here
is what only a simulated device needs (PCI ids, VBIOS, bus ids, healthy test results). The
simulator runs on lab nodes with the standard library alone and without gpuforge, so it reads
the catalogue as a file: the copy its package carries beside this module
(``lab/sim/build_packages.py`` puts it there), else gpuforge's own, beside the ``gpuforge``
package (an installed wheel) or in the checkout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CATALOGUE_NAME = "skus.json"
#: Where the catalogue is looked for, in order: the node package's copy beside this module,
#: gpuforge's beside an installed wheel's ``gpuforge_sim``, a checkout's (``lab/sim/`` ->
#: ``src/gpuforge/``), and that of the wheel whose project copy (``gpuforge/_project/lab/sim``,
#: where the lab mirror runs build_packages.py) this module is.
CATALOGUE_PATHS = (
    HERE / CATALOGUE_NAME,
    HERE.parent / "gpuforge" / "topology" / "data" / CATALOGUE_NAME,
    HERE.parents[2] / "src" / "gpuforge" / "topology" / "data" / CATALOGUE_NAME,
    *(
        [HERE.parents[3] / "topology" / "data" / CATALOGUE_NAME]
        if HERE.parents[2].name == "_project"
        else []
    ),
)


@cache
def catalogue() -> dict[str, dict[str, Any]]:
    """gpuforge's SKU catalogue by key (the raw entries of ``skus.json``)."""
    for path in CATALOGUE_PATHS:
        if path.is_file():
            doc = json.loads(path.read_text(encoding="utf-8"))
            return {str(raw["key"]): raw for raw in doc["skus"]}
    raise FileNotFoundError(f"no SKU catalogue at {', '.join(map(str, CATALOGUE_PATHS))}")


@dataclass(frozen=True)
class Sku:
    """What one GPU model looks like to the tools, and how fast a healthy node of it is."""

    key: str
    product_name: str
    architecture: str
    device_id: str  # PCI device id as nvidia-smi prints it (0xDDDDVVVV)
    subsys_id: str
    pci_short_id: str  # dcgmi "GPU Device IDs Detected"
    fb_total_mib: int
    fb_reserved_mib: int
    bar1_total_mib: int
    power_limit_w: float
    min_power_limit_w: float
    max_graphics_mhz: int
    max_memory_mhz: int
    max_video_mhz: int
    vbios: str
    board_part: str
    gpu_part: str
    inforom_image: str
    remap_banks: int
    compute_cap: str
    pcie_gen: int
    nvlinks: int
    nvlink_gbps: str  # per-link figure printed by `nvidia-smi nvlink -s` (GB/s)
    nvswitch: bool
    bus_ids: tuple[int, ...]
    hbm_gbps: float  # DCGM memory bandwidth test healthy result (GB/s)
    burn_gflops: int  # gpu-burn Gflop/s per GPU (FP32 SGEMM)
    # nccl-tests busbw plateau (GB/s) inside one 8-GPU node, per collective.
    intra_busbw: dict[str, float] = field(default_factory=dict)
    small_latency_us: float = 12.0
    numa_split: int = 4  # GPUs 0..numa_split-1 on NUMA node 0


# nvidia-smi -q figures come from the real captures in shared/fixtures/real/nvidia-smi/
# (gpud 535.161.08 8x H100, nvidia_gpu_exporter H200 590.48.01, telegraf A100-SXM4-80GB).
_DEVICES: dict[str, dict[str, Any]] = {
    "H100-SXM-80GB": {
        "device_id": "0x233010DE",
        "subsys_id": "0x16C110DE",
        "pci_short_id": "2330",
        "fb_total_mib": 81559,
        "fb_reserved_mib": 551,
        "bar1_total_mib": 131072,
        "min_power_limit_w": 200.0,
        "max_graphics_mhz": 1980,
        "max_memory_mhz": 2619,
        "max_video_mhz": 1545,
        "vbios": "96.00.74.00.0D",
        "board_part": "692-2G520-0200-000",
        "gpu_part": "2330-885-A1",
        "inforom_image": "G520.0200.00.05",
        "remap_banks": 2560,
        "compute_cap": "9.0",
        "nvlinks": 18,
        "nvlink_gbps": "26.562",
        "nvswitch": True,
        "bus_ids": (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
        # H100 SXM5 HBM3 3.35 TB/s datasheet; DCGM's memory bandwidth plugin reaches ~90 %.
        "hbm_gbps": 3010.0,
        # gpu-burn FP32 on H100 SXM: ~ 50-55 TFLOP/s reported in gpu-burn issues.
        "burn_gflops": 52700,
        # NVLS all_reduce on 8x H100 SXM ~ 480 GB/s (NVIDIA NCCL 2.18 NVLS blog; a3mega capture
        # plateaus at 338 GB/s across 2 nodes); ring ~ 370. all_gather/alltoall ring-bound.
        "intra_busbw": {
            "all_reduce": 480.0,
            "all_gather": 365.0,
            "alltoall": 340.0,
            "sendrecv": 375.0,
        },
        "small_latency_us": 12.0,
    },
    "H200-SXM-141GB": {
        "device_id": "0x233510DE",
        "subsys_id": "0x18BE10DE",
        "pci_short_id": "2335",
        "fb_total_mib": 143771,
        "fb_reserved_mib": 614,
        "bar1_total_mib": 262144,
        "min_power_limit_w": 200.0,
        "max_graphics_mhz": 1980,
        "max_memory_mhz": 3201,
        "max_video_mhz": 1545,
        "vbios": "96.00.A5.00.03",
        "board_part": "692-2G520-0280-000",
        "gpu_part": "2335-895-A1",
        "inforom_image": "G520.0280.02.02",
        "remap_banks": 3072,
        "compute_cap": "9.0",
        "nvlinks": 18,
        "nvlink_gbps": "26.562",
        "nvswitch": True,
        "bus_ids": (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
        "hbm_gbps": 4300.0,  # H200 HBM3e 4.8 TB/s datasheet, ~90 % achieved
        "burn_gflops": 53100,
        # Azure ND H200 v5 capture: 476.96 GB/s at 8 GB on one node; OCI 2-node 486 GB/s.
        "intra_busbw": {
            "all_reduce": 482.0,
            "all_gather": 368.0,
            "alltoall": 342.0,
            "sendrecv": 378.0,
        },
        "small_latency_us": 12.0,
    },
    "A100-SXM-80GB": {
        "device_id": "0x20B210DE",
        "subsys_id": "0x147F10DE",
        "pci_short_id": "20b2",
        "fb_total_mib": 81920,
        "fb_reserved_mib": 869,
        "bar1_total_mib": 131072,
        "min_power_limit_w": 100.0,
        "max_graphics_mhz": 1410,
        "max_memory_mhz": 1593,
        "max_video_mhz": 1290,
        "vbios": "92.00.36.00.02",
        "board_part": "692-2G506-0212-002",
        "gpu_part": "20B2-895-A1",
        "inforom_image": "G506.0212.00.01",
        "remap_banks": 640,
        "compute_cap": "8.0",
        "nvlinks": 12,
        "nvlink_gbps": "25",
        "nvswitch": True,
        "bus_ids": (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
        "hbm_gbps": 1780.0,  # A100 80GB HBM2e 2.04 TB/s datasheet
        "burn_gflops": 18200,
        # superbench 8x A100-SXM4 all_reduce ~ 235 GB/s at 8 GB (old format capture).
        "intra_busbw": {
            "all_reduce": 232.0,
            "all_gather": 228.0,
            "alltoall": 205.0,
            "sendrecv": 230.0,
        },
        "small_latency_us": 20.0,
    },
    "B200-SXM-180GB": {
        "device_id": "0x290110DE",
        "subsys_id": "0x199910DE",
        "pci_short_id": "2901",
        "fb_total_mib": 183359,
        "fb_reserved_mib": 1078,
        "bar1_total_mib": 262144,
        "min_power_limit_w": 200.0,
        "max_graphics_mhz": 1965,
        "max_memory_mhz": 3996,
        "max_video_mhz": 1740,
        "vbios": "97.00.6A.00.0C",
        "board_part": "692-2G525-0200-000",
        "gpu_part": "2901-886-A1",
        "inforom_image": "G525.0200.00.04",
        "remap_banks": 4096,
        "compute_cap": "10.0",
        "nvlinks": 18,
        "nvlink_gbps": "53.125",
        "nvswitch": True,
        "bus_ids": (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
        "hbm_gbps": 7000.0,  # B200 HBM3e 8 TB/s datasheet
        "burn_gflops": 74000,
        # NVLink 5 doubles NVLink 4 (1.8 TB/s per GPU); published 8x B200 NVLS all_reduce ~ 800+.
        "intra_busbw": {
            "all_reduce": 820.0,
            "all_gather": 660.0,
            "alltoall": 610.0,
            "sendrecv": 690.0,
        },
        "small_latency_us": 11.0,
    },
}


def _sku(key: str, device: dict[str, Any]) -> Sku:
    entry = catalogue()[key]
    return Sku(
        key=key,
        product_name=str(entry["product_name"]),
        architecture=str(entry["architecture"]),
        power_limit_w=float(entry["power_w"]),
        pcie_gen=int(entry["validation"]["pcie_gen"]),
        **device,
    )


SKUS: dict[str, Sku] = {key: _sku(key, device) for key, device in _DEVICES.items()}

_ALIASES = {
    "h100": "H100-SXM-80GB",
    "h200": "H200-SXM-141GB",
    "a100": "A100-SXM-80GB",
    "b200": "B200-SXM-180GB",
}

# Effective RDMA payload throughput of one port, as a fraction of the signalling rate.
# ib_write_bw on NDR 400G reaches ~ 390 Gb/s (97.5 %); HDR 200G ~ 195 Gb/s.
IB_WRITE_EFFICIENCY = 0.975
# NCCL over one rail reaches ~ 46-48 GB/s busbw per 400G NIC (≈ 0.93 of 50 GB/s), so 8 rails give
# ~ 370 GB/s cross-node busbw (NVIDIA DGX H100 reference: 8x CX-7 NDR; a3mega 338 GB/s).
NCCL_NET_EFFICIENCY = 0.93

# nvidia-smi "CUDA Version" by driver branch.
CUDA_BY_BRANCH = {
    "535": "12.2",
    "550": "12.4",
    "560": "12.6",
    "565": "12.7",
    "570": "12.8",
    "575": "12.9",
    "580": "13.0",
    "590": "13.1",
}


def resolve_sku(model: str) -> Sku:
    """Map a topology GPU model name (``H100-SXM-80GB``, ``h100`` ...) to its SKU.

    Raises:
        KeyError: no simulated SKU matches.
    """
    if model in SKUS:
        return SKUS[model]
    for key, sku in SKUS.items():
        if model in catalogue()[key].get("names", []):
            return sku
    low = model.lower()
    for alias, key in _ALIASES.items():
        if alias in low:
            return SKUS[key]
    raise KeyError(f"no simulated GPU model matches {model!r}; known: {', '.join(SKUS)}")
