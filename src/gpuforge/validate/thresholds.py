"""Per-SKU performance floors, with their sources, and the peer comparison inside a batch.

Absolute floors catch a node that is broken; the peer comparison catches a node that is merely
much worse than its identical siblings (a half-seated cable, a throttling GPU) while still above
the floor. Both apply: a node must clear the floor *and* not be a low outlier among its peers.

Floors are a fraction (``ACCEPT_FRACTION``) of a *reference* figure that was published for that
hardware, never of a theoretical peak. The figures and their sources are the SKU catalogue's
(:mod:`gpuforge.topology.skus`, ``data/skus.json``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuforge.errors import InputError
from gpuforge.topology.skus import Sku, catalogue, validated, validated_keys
from gpuforge.validate.result import Status

#: A measured large-message busbw below this fraction of the published reference fails.
ACCEPT_FRACTION = 0.85

#: perftest ib_write_bw per port, as a fraction of the signalling rate (NDR 400 -> 360 Gb/s).
#: ib_write_bw reaches ~0.96-0.98 of line rate on a healthy ConnectX-7 port; 0.9 leaves room for
#: PCIe overheads while still catching a port trained at a lower speed or width.
IB_WRITE_BW_FRACTION = 0.90

#: gpu-burn (FP32 SGEMM, the default ``gpu_burn N``) floor per GPU as a fraction of the datasheet
#: FP32 figure. No measured gpu-burn figure with a traceable source exists for these SKUs, so this
#: one departs from the rule above: a healthy GPU's SGEMM reaches ~0.75-0.8 of the FP32 figure,
#: a GPU held at its power cap or throttled ~0.5; 0.6 separates the two. Provisional: it only
#: judges batches too small for the peer comparison, which stays the finer test.
GPU_BURN_FRACTION = 0.6

#: NCCL busbw one 400G NIC sustains in a cross-node all_reduce: 400 Gb/s = 50 GB/s raw; NVIDIA and
#: cloud providers report ~46-48 GB/s per NDR NIC (e.g. 8x400G H100 nodes at 370-390 GB/s busbw;
#: Voltage Park's public 4-node H100 run: 330.9 GB/s over 8 NICs). Per-GB of line rate:
NCCL_NET_EFFICIENCY = 0.94


@dataclass(frozen=True)
class SkuThresholds:
    """Floors for one GPU SKU. Bandwidths in GB/s (bytes), as nccl-tests prints them."""

    sku: str
    gpus: int
    #: Published large-message (>= 1 GiB) 8-GPU single-node all_reduce busbw, GB/s.
    nvlink_allreduce_ref_gbs: float
    #: Where ``nvlink_allreduce_ref_gbs`` comes from.
    source: str
    #: PCIe generation and width every GPU's link must train to (the SKU's host interface).
    pcie_gen: int = 5
    pcie_width: int = 16
    #: Datasheet FP32 (non-tensor) TFLOP/s of one GPU, which gpu-burn's SGEMM approaches;
    #: None = no gpu-burn floor, the peer comparison only.
    fp32_tflops: float | None = None
    #: Where ``fp32_tflops`` comes from.
    fp32_source: str = ""

    @property
    def nvlink_allreduce_floor_gbs(self) -> float:
        """8-GPU all_reduce busbw floor."""
        return round(self.nvlink_allreduce_ref_gbs * ACCEPT_FRACTION, 1)

    @property
    def gpu_burn_min_gflops(self) -> float | None:
        """gpu-burn Gflop/s floor per GPU (``GPU_BURN_FRACTION`` of the FP32 figure), or None."""
        if self.fp32_tflops is None:
            return None
        return round(self.fp32_tflops * 1000 * GPU_BURN_FRACTION, 0)


def _thresholds(sku: Sku) -> SkuThresholds:
    val = sku.validation
    assert val is not None  # noqa: S101 - only validated SKUs are passed
    return SkuThresholds(
        sku=sku.key,
        gpus=val.gpus,
        nvlink_allreduce_ref_gbs=val.nvlink_allreduce_ref_gbs,
        source=val.source,
        pcie_gen=val.pcie_gen,
        pcie_width=val.pcie_width,
        fp32_tflops=val.fp32_tflops,
        fp32_source=val.fp32_source,
    )


#: The floors of every SKU the catalogue (gpuforge.topology.skus, data/skus.json: the figures
#: and their sources) has validation figures for.
SKUS: Mapping[str, SkuThresholds] = {key: _thresholds(catalogue()[key]) for key in validated_keys()}


def for_sku(model: str) -> SkuThresholds:
    """The thresholds for a GPU model name as the topology spells it; InputError when unknown."""
    sku = validated(model)
    if sku is not None:
        return SKUS[sku.key]
    raise InputError(f"no thresholds for GPU model {model!r}; known: {', '.join(sorted(SKUS))}")


def ib_write_bw_floor_gbps(rate_gbps: float) -> float:
    """ib_write_bw floor in Gb/s for a port of ``rate_gbps`` (400 -> 360)."""
    return round(rate_gbps * IB_WRITE_BW_FRACTION, 1)


def nccl_net_floor_gbs(nics: int, rate_gbps: float) -> float:
    """Cross-node all_reduce busbw floor in GB/s for nodes with ``nics`` compute NICs.

    One 400G NIC: 400/8 = 50 GB/s x 0.94 = 47 GB/s reference, x 0.85 = 40 GB/s floor.
    """
    per_nic_ref = rate_gbps / 8.0 * NCCL_NET_EFFICIENCY
    return round(nics * per_nic_ref * ACCEPT_FRACTION, 1)


# --- peer comparison ---------------------------------------------------------------------------

#: Iglewicz & Hoaglin (1993) recommend |modified z| > 3.5 as the outlier cut; we warn there.
PEER_WARN_Z = 3.5
#: Well past any plausible noise: fail (together with a material deficit, below).
PEER_FAIL_Z = 6.0
#: A node must also be this far below the median for the outlier to matter (noise on a tight
#: fleet gives huge z-scores for a 1% difference).
PEER_WARN_DEFICIT = 0.03
PEER_FAIL_DEFICIT = 0.08
#: The scale never drops under 0.5% of the median, so MAD = 0 (identical peers) cannot divide by 0.
MAD_FLOOR_FRACTION = 0.005
#: Fewer peers than this and the median means little: no peer verdict.
PEER_MIN = 5


@dataclass(frozen=True)
class PeerScore:
    """Where one node's value sits among its peers (higher values are better)."""

    node: str
    value: float
    median: float
    z: float
    deficit: float
    status: Status


def robust_z(values: Mapping[str, float]) -> dict[str, float]:
    """Modified z-score ``0.6745 (x - median) / MAD`` per key; MAD floored (see above)."""
    if not values:
        return {}
    data = list(values.values())
    med = statistics.median(data)
    mad = statistics.median([abs(v - med) for v in data])
    scale = max(mad, abs(med) * MAD_FLOOR_FRACTION, 1e-12)
    return {k: 0.6745 * (v - med) / scale for k, v in values.items()}


def peer_scores(
    values: Mapping[str, float], reference: Mapping[str, float] | None = None
) -> dict[str, PeerScore]:
    """Score every node of ``values`` against the median of ``values`` and ``reference``.

    ``reference`` holds values of nodes already admitted (known good): they join the pool the
    median and the MAD come from, but get no score. Empty when the pool has fewer than PEER_MIN.
    """
    pool = {**(reference or {}), **values}
    if len(pool) < PEER_MIN:
        return {}
    med = statistics.median(pool.values())
    zs = robust_z(pool)
    out: dict[str, PeerScore] = {}
    for node, value in values.items():
        deficit = (med - value) / med if med > 0 else 0.0
        z = zs[node]
        if z <= -PEER_FAIL_Z and deficit >= PEER_FAIL_DEFICIT:
            status = Status.FAIL
        elif z <= -PEER_WARN_Z and deficit >= PEER_WARN_DEFICIT:
            status = Status.WARN
        else:
            status = Status.PASS
        out[node] = PeerScore(node, value, med, round(z, 2), round(deficit, 4), status)
    return out


def low_outliers(values: Mapping[str, float]) -> Sequence[PeerScore]:
    """The nodes the peer comparison warns about or fails, worst first."""
    scores = [s for s in peer_scores(values).values() if s.status is not Status.PASS]
    return sorted(scores, key=lambda s: s.z)
