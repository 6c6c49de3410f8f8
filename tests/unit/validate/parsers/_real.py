"""The real tool outputs in tests/fixtures/real, and which parser kind reads each one."""

from __future__ import annotations

from tests.unit.conftest import REAL_FIXTURES as REAL
from tests.unit.conftest import real_fixture

__all__ = ["KIND_OF", "REAL", "of_kind", "real_text"]

# Every file of the fixture tree, and the KIND that reads it; None (with why) for outputs of
# tools gpuforge has no parser for.
KIND_OF: dict[str, str | None] = {
    "nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt": "nccl-tests",
    "nccl-tests/awsome-p4de-a100-2node-efa-all_reduce_perf-srun-prefixed-excerpt.txt": "nccl-tests",
    "nccl-tests/awsome-p5-h100-2node-efa-all_reduce_perf-srun-prefixed-excerpt.txt": "nccl-tests",
    "nccl-tests/azh200doc-h200-8gpu-all_reduce_perf-8G-single-size.txt": "nccl-tests",
    "nccl-tests/coreweave-h100-64gpu-sharp-all_reduce_perf-excerpt.txt": "nccl-tests",
    "nccl-tests/deepops-dgxa100-2node-hdr-all_reduce_perf-old-format.txt": "nccl-tests",
    "nccl-tests/deepops-roce-2node-all_reduce_perf-old-format-low-bw.txt": "nccl-tests",
    "nccl-tests/ocihowto-h200-2node-16gpu-all_reduce_perf.txt": "nccl-tests",
    "nccl-tests/superbench-a100-40gb-8gpu-all_gather_perf.txt": "nccl-tests",
    "nccl-tests/superbench-a100-40gb-8gpu-all_reduce_perf.txt": "nccl-tests",
    "nccl-tests/superbench-a100-40gb-8gpu-alltoall_perf.txt": "nccl-tests",
    "nvidia-smi/azhpcdiag-issue73-v100-nvlink-s-inactive-links-excerpt.txt": "nvlink",
    "nvidia-smi/aznhc-8gpu-q-d-page_retirement-healthy.txt": "nvidia-smi-q",
    "nvidia-smi/aznhc-a100-80gb-nvlink-status-all-links-inactive.txt": "nvlink",
    "nvidia-smi/gpud-a100-80gb-8gpu-nvlink-status.txt": "nvlink",
    "nvidia-smi/gpud-h100-8gpu-default-table-550.90.07.txt": None,  # plain `nvidia-smi` table
    "nvidia-smi/gpud-h100-8gpu-q-535.161.08.txt": "nvidia-smi-q",
    "nvidia-smi/gpud-h100-q-535.183.01-truncated-invalid-keys.txt": "nvidia-smi-q",
    "nvidia-smi/gpud-pr80-remapped-rows-uncorrectable-pending-fragment.txt": "nvidia-smi-q",
    "nvidia-smi/mleng-a100-80gb-q-ecc-dram-correctable-remap-pending-excerpt.txt": "nvidia-smi-q",
    "nvidia-smi/mleng-a100-8gpu-topo-m.txt": "nvidia-smi-topo",
    "nvidia-smi/mleng-h100-8gpu-topo-m.txt": "nvidia-smi-topo",
    "nvidia-smi/mleng-q-ecc-sram-uncorrectable-excerpt.txt": "nvidia-smi-q",
    "nvidia-smi/nccl-issue1617-4xh100-nv6-topo-m-with-nics-legend-cut.txt": "nvidia-smi-topo",
    "nvidia-smi/nge-h100-80gb-hbm3-nvlink-s.txt": "nvlink",
    "nvidia-smi/nge-h100-80gb-hbm3-q-load.txt": "nvidia-smi-q",
    "nvidia-smi/nge-h100-80gb-hbm3-query-gpu-csv-load.txt": "nvidia-smi-csv",
    "nvidia-smi/nge-h100-80gb-hbm3-topo-m-1gpu.txt": "nvidia-smi-topo",
    "nvidia-smi/nge-h100-mig-q-load.txt": "nvidia-smi-q",
    "nvidia-smi/nge-h200-q-load.txt": "nvidia-smi-q",
    "nvidia-smi/nge-h200-query-gpu-csv-load.txt": "nvidia-smi-csv",
    "nvidia-smi/nge-h200-topo-m.txt": "nvidia-smi-topo",
    "nvidia-smi/telegraf-a100-sxm4-80gb-mig-q-x.xml.txt": "nvidia-smi-xml",
    "ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt": "ibv_devinfo",
    "ib/aznhc-syslog-ib6-lost-carrier-flaps.txt": "xid",  # a syslog: scanned, no Xid in it
    "ib/gpud-ibstat-a100-azure-hdr200-ibpanic-failure.txt": "ibstat",
    "ib/gpud-ibstat-a100-node-mt4126-200.txt": "ibstat",
    "ib/gpud-ibstat-h100-node-cx7-400-roce-all-active.txt": "ibstat",
    "ib/gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt": "ibstat",
    "ib/gpud-ibstat-h100-node-cx7-ndr400-ib-cx6dx-ports-down.txt": "ibstat",
    "ib/idx41237316056-iblinkinfo-S-quantum-hdr-switch-polling-and-speed-degraded.txt": None,
    "ib/idx41237316056-ibv_devinfo-mixed-cx4lx-cx5-cx6hdr-ports-down.txt": "ibv_devinfo",
    "ib/nccltests-issue71-iblinkinfo-edr-hdr-mqm8700-excerpt.txt": None,  # iblinkinfo
    "ib/perftest-issue273-ib_write_bw-postlist-8B-roce.txt": "ib_write_bw",
    "ib/superbench-ib_write_bw-loopback-8M.txt": "ib_write_bw",
    "ib/superbench-ib_write_bw-loopback-all-sizes.txt": "ib_write_bw",
    "dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt": "dcgmi",
    "dcgmi/azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt": "dcgmi",
    "dcgmi/dcgm-issue198-h100nvl-2gpu-nvlink-link-status-all-down.txt": "dcgmi-nvlink",
    "dcgmi/dcgm-issue94-a100-80gb-pcie-mig-incompatible-error.txt": "dcgmi",
    "dcgmi/gcm-8gpu-12link-dcgmi-nvlink-s.txt": "dcgmi-nvlink",
    "dcgmi/gcm-dcgmi-nvlink-e-g0-head9.txt": None,  # `dcgmi nvlink -e`: refused by dcgmi-nvlink
    "dcgmi/idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt": "dcgmi",
    "dcgmi/mleng-dcgmi-diag-r3-row-remap-pending-excerpt.txt": "dcgmi",
    "dcgmi/virtualclient-t4-dcgmi-diag-r3-j.json.txt": "dcgmi",
    "kernel/gpuburn-issue12-16gpu-faulty-summary.txt": "gpu-burn",
    "kernel/gpud-dmesg-decode-iso-xid13-xid43.txt": "xid",
    "kernel/gpud-readme-h100-xid79-sxid20034-blockquote.txt": "xid",
    "kernel/mleng-a100-xid63-row-remapper.txt": "xid",
    "kernel/nvsentinel-issue155-l40-fallen-off-bus-no-xid.txt": "xid",
    "kernel/ogkm-issue1150-xid45-after-xid145-149-nvlink-excerpt.txt": "xid",
    "kernel/superbench-a100-80gb-8gpu-gpu_burn.txt": "gpu-burn",
}


real_text = real_fixture


def of_kind(kind: str) -> list[str]:
    """Fixture files that ``kind`` reads."""
    return sorted(name for name, k in KIND_OF.items() if k == kind)
