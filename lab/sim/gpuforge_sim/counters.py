"""Counters that grow with time: IB port counters and a degrading GPU's correctable ECC.

Values are computed from the clock (the fault's injection time, this boot, now), never stored,
so every reader (perfquery, the sysfs tree, nvidia-smi, dcgm-exporter) sees the same number and
two reads a minute apart show the growth. Port counters restart at boot, as an HCA's do when
the driver loads.
"""

from __future__ import annotations

from typing import Any

from . import lifecycle
from .state import NodeView

#: The kernel's sysfs names of a port's counters (``/sys/class/infiniband/<dev>/ports/<p>/
#: counters/``) with the PortCounters field perfquery prints and its width in bits.
PORT_COUNTERS: dict[str, tuple[str, int]] = {
    "symbol_error": ("SymbolErrorCounter", 16),
    "link_error_recovery": ("LinkErrorRecoveryCounter", 8),
    "link_downed": ("LinkDownedCounter", 8),
    "port_rcv_errors": ("PortRcvErrors", 16),
    "port_rcv_remote_physical_errors": ("PortRcvRemotePhysicalErrors", 16),
    "port_rcv_switch_relay_errors": ("PortRcvSwitchRelayErrors", 16),
    "port_xmit_discards": ("PortXmitDiscards", 16),
    "port_xmit_constraint_errors": ("PortXmitConstraintErrors", 8),
    "port_rcv_constraint_errors": ("PortRcvConstraintErrors", 8),
    "local_link_integrity_errors": ("LocalLinkIntegrityErrors", 4),
    "excessive_buffer_overrun_errors": ("ExcessiveBufferOverrunErrors", 4),
    "VL15_dropped": ("VL15Dropped", 16),
    "port_xmit_data": ("PortXmitData", 32),
    "port_rcv_data": ("PortRcvData", 32),
    "port_xmit_packets": ("PortXmitPkts", 32),
    "port_rcv_packets": ("PortRcvPkts", 32),
    "port_xmit_wait": ("PortXmitWait", 32),
}
#: Background traffic of an idle node's port (subnet management, IPoIB chatter), per second:
#: data in 4-octet words as the PMA counts it, and packets.
IDLE_WORDS_PER_S = 2_500
IDLE_PACKETS_PER_S = 40


def port_counters(node: NodeView, rail: int) -> dict[str, int]:
    """Every counter of ``rail``'s port now, full width (sysfs shows 64-bit data counters)."""
    boot, at = lifecycle.boot_time(), lifecycle.now()
    up = max(0.0, at - boot)
    values = dict.fromkeys(PORT_COUNTERS, 0)
    down = any(f["kind"] in ("ib_port_down", "ib_port_polling") for f in node.rail_faults(rail))
    if not down:
        values["port_xmit_data"] = int(up * IDLE_WORDS_PER_S)
        values["port_rcv_data"] = int(up * IDLE_WORDS_PER_S * 1.02)
        values["port_xmit_packets"] = int(up * IDLE_PACKETS_PER_S)
        values["port_rcv_packets"] = int(up * IDLE_PACKETS_PER_S * 1.02)
    for f in node.rail_faults(rail):
        grown = lifecycle.elapsed(f, boot, at)
        if f["kind"] == "link_flap":
            values["link_downed"] += int(f.get("count", 3))
        elif f["kind"] in ("ib_port_down", "ib_port_polling"):
            values["link_downed"] += 1
        elif f["kind"] == "ib_errors":
            values[str(f["counter"])] += int(grown * int(f.get("per_hour", 600)) / 3600.0)
    return values


def saturated(name: str, value: int) -> int:
    """``value`` as perfquery's PortCounters shows it: stuck at the field's maximum."""
    bits = PORT_COUNTERS[name][1]
    return min(value, (1 << bits) - 1)


def ecc_degrading(fault: dict[str, Any], boot: float, at: float) -> tuple[int, int]:
    """``(correctable ECC errors, correctable remapped rows)`` of a degrading GPU at ``at``.

    The error rate rises linearly from 0 to ``peak_per_hour`` over ``hours`` of simulated time
    (``speedup`` simulated seconds per real second) and stays there; the remapped rows rise
    linearly to ``rows`` over the same span. The count is the rate's integral.
    """
    span = float(fault.get("hours", 1)) * 3600.0
    t = lifecycle.elapsed(fault, boot, at) * float(fault.get("speedup", 1))
    peak = float(fault.get("peak_per_hour", 600)) / 3600.0
    ramp = min(t, span)
    errors = peak * ramp * ramp / (2 * span) + peak * max(0.0, t - span)
    rows = int(int(fault.get("rows", 6)) * min(1.0, t / span))
    return int(errors), rows
