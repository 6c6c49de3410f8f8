"""Prometheus alert and recording rules for a gpuforge cluster (docs/monitoring.md, "Rules").

:func:`render_rules` returns two Prometheus rule files:

* ``gpuforge-alerts.yml``: every alert and the fleet recording rules. It depends only on the Xid
  catalogue (:mod:`gpuforge.validate.xid_catalogue`), so it is the same for every cluster and is
  also checked in as ``roles/prometheus/files/rules/gpuforge-alerts.yml`` (a unit test keeps the
  two in step).
* ``gpuforge-records.yml``: what the spec knows and no exporter does: one power budget per GPU
  rack, each node type's base load and GPU power limit, each rail's expected port rate, and (on a
  rail-optimised fabric) which leaf each SU's rail goes to.

Every alert carries ``severity`` (critical, warning, info) and annotations ``summary`` (naming the
node and the GPU or port) and ``runbook_url`` (``docs/runbooks/<alert>.md``).

Metric names are the exporters' own (the sources are cited in docs/monitoring.md):
dcgm-exporter's ``DCGM_FI_DEV_*`` (etc/default-counters.csv; the ECC, violation and throttle
fields need the counters file of the ``dcgm_exporter`` role), node_exporter's infiniband collector
``node_infiniband_*{device,port}`` and gpuforge's own textfile metrics (``gpuforge_health_*``,
``gpuforge_conformance_*``; docs/monitoring.md). Every target carries the file_sd labels
``cluster``, ``su``, ``rack``, ``leaf``, ``node_type``, ``phase`` and ``node``.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuforge.topology.cluster import Cluster
from gpuforge.topology.skus import power_w as sku_power_w
from gpuforge.validate.catalogue import CLOCK_WARN_S
from gpuforge.validate.xid_catalogue import Action, XidCatalogue, catalogue

#: Where the runbooks are published; ``runbook_url`` is ``<base>/<AlertName>.md``.
RUNBOOK_BASE = "https://github.com/gpuforge/gpuforge/blob/main/docs/runbooks"
#: The repository directory holding one runbook per alert.
RUNBOOK_DIR = Path("docs/runbooks")
ALERTS_FILE = "gpuforge-alerts.yml"
RECORDS_FILE = "gpuforge-records.yml"
SEVERITIES = ("critical", "warning", "info")

#: Maximum board power per GPU comes from the SKU catalogue (gpuforge.topology.skus, with its
#: datasheet sources); a model the catalogue does not know falls back to this.
DEFAULT_GPU_POWER_W = 700.0
#: The base load (CPUs, memory, NICs, fans) is the node's spec peak (``power_kw``) less its GPUs'
#: maximum; a node type whose GPUs alone reach its peak still counts this fraction of it.
MIN_BASE_FRACTION = 0.1

# Thresholds (one place; the runbooks quote them).
GPU_TEMP_MAX_C = 85
HBM_TEMP_MAX_C = 95
SYMBOL_ERRORS_PER_HOUR = 10
FLAPS_PER_12H = 3
HEALTH_STALE_S = 900
CONFORMANCE_STALE_S = 2 * 86400
DRAINED_TOO_LONG = "24h"

# NVML clock event (throttle) reason bits, as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS reports them.
_SW_THERMAL, _HW_THERMAL, _HW_SLOWDOWN, _HW_POWER_BRAKE = 0x20, 0x40, 0x08, 0x80

_GPU = "{{ with $labels.gpu }}GPU {{ . }}{{ else }}a GPU{{ end }}"
_PORT = "{{ $labels.device }} port {{ $labels.port }}"
_WHERE = "{{ $labels.node }} (rack {{ $labels.rack }})"


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``summary`` is a Prometheus template naming the node and GPU/port.

    ``description`` says what the alert means; it is the first line of the alert's runbook
    (docs/runbooks/<name>.md, which a unit test requires), not an annotation.
    """

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = "0s"
    labels: Mapping[str, str] = field(default_factory=dict)

    def rule(self, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
        """The rule as Prometheus's rule-file mapping."""
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0s":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {
            "summary": self.summary,
            "runbook_url": f"{runbook_base}/{self.name}.md",
        }
        return out


def _any_of(metric: str, values: Iterable[int]) -> str:
    return " or ".join(f"{metric} == {v}" for v in sorted(values))


def _bit(metric: str, bit: int) -> str:
    return f"floor({metric} / {bit}) % 2 == 1"


def _throttle(bits: Sequence[int]) -> str:
    # DCGM 3.x names the field CLOCK_THROTTLE_REASONS, DCGM 4 CLOCKS_EVENT_REASONS: take either.
    parts = [
        _bit(m, b)
        for m in ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        for b in bits
    ]
    return " or ".join(f"({p})" for p in parts)


def _check(check: str, op: str = "== 2") -> str:
    return f'gpuforge_health_check_status{{check="{check}"}} {op}'


_XID_ALERTS = {
    Action.RESET_GPU: "GpuXidResetGpu",
    Action.REBOOT: "GpuXidReboot",
    Action.INSPECT: "GpuXidInspect",
    Action.RMA: "GpuXidRma",
}
#: Checks that have an alert of their own (a regex); GpuforgeHealthCheckFailed covers the rest.
_DEDICATED_CHECKS = (
    "gpu[.](ecc_uncorrectable|row_remap|nvlink)|fabric[.](port|flaps|counters|roce_pfc)"
    "|conformance[.]drift"
)


def xid_alerts(cat: XidCatalogue) -> list[Alert]:
    """Alerts on dcgm-exporter's last-Xid gauge, one per catalogue action class.

    ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* Xid a GPU reported (0: none), so the
    hardware classes fire while the last Xid is of their class (until the next Xid or the restart
    of nv-hostengine that a reset or reboot brings); the application class fires for an hour after
    the value changed. Xid 79 has its own alert, GpuFellOffBus.
    """
    out = []
    for action, name in _XID_ALERTS.items():
        codes = [
            e.code
            for e in cat.entries.values()
            if e.action == action and not e.user_caused and e.code != 79
        ]
        if not codes:
            continue
        out.append(
            Alert(
                name,
                _any_of("DCGM_FI_DEV_XID_ERRORS", codes),
                "critical",
                f"{_GPU} on {_WHERE} reported Xid {{{{ $value }}}}: {action.value}",
                f"The last Xid of the GPU is one the catalogue answers with {action.value} "
                f"(Xids {', '.join(map(str, sorted(codes)))}). gpuforge's gpu.xid check drains the "
                f"node as gpuforge:gpu.xid:{action.value}.",
                labels={"action": action.value},
            )
        )
    monitor = [e.code for e in cat.entries.values() if e.action == Action.MONITOR]
    changed = (
        "DCGM_FI_DEV_XID_ERRORS unless (DCGM_FI_DEV_XID_ERRORS offset 1h == DCGM_FI_DEV_XID_ERRORS)"
    )
    out.append(
        Alert(
            "GpuXidApplication",
            f"({_any_of('DCGM_FI_DEV_XID_ERRORS', monitor)}) and ({changed})",
            "warning",
            f"{_GPU} on {_WHERE} reported Xid {{{{ $value }}}}: job failed, node stays in service",
            "A new Xid of the monitor class (application-caused or an early sign) in the last "
            "hour. The job most likely failed; the node is not suspect on this alone.",
            labels={"action": "monitor"},
        )
    )
    return out


def alerts(cat: XidCatalogue | None = None) -> list[Alert]:
    """Every gpuforge alert, in the order of docs/monitoring.md."""
    cat = cat or catalogue()
    out: list[Alert] = [
        Alert(
            "GpuFellOffBus",
            f"DCGM_FI_DEV_XID_ERRORS == 79 or {_check('gpu.count')}",
            "critical",
            f"{_GPU} on {_WHERE} fell off the bus (Xid 79) or is missing",
            "The GPU stopped answering on PCIe (Xid 79), or the node sees fewer GPUs than its "
            "node type has. Jobs on the node fail; the node is drained for reboot.",
            labels={"action": "reboot"},
        ),
        *xid_alerts(cat),
        Alert(
            "GpuEccUncorrectable",
            "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0 or "
            + _check("gpu.ecc_uncorrectable"),
            "critical",
            f"{_GPU} on {_WHERE} had an uncorrectable (double-bit) ECC error",
            "Volatile double-bit ECC errors grew in the last 10 minutes, or the node's "
            "gpu.ecc_uncorrectable check failed.",
            labels={"action": "reset_gpu"},
        ),
        Alert(
            "GpuRowRemapPending",
            "DCGM_FI_DEV_ROW_REMAP_PENDING > 0 or "
            "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]) > 0 or "
            + _check("gpu.row_remap"),
            "critical",
            f"{_GPU} on {_WHERE} has a memory row remap pending a GPU reset",
            "DCGM reports a row remap pending (DCGM_FI_DEV_ROW_REMAP_PENDING, field 396), a row "
            "was remapped for an uncorrectable error in the last hour, or the node's gpu.row_remap "
            "check failed; the remap takes effect at the next GPU reset.",
            labels={"action": "reset_gpu"},
        ),
        Alert(
            "GpuRowRemapFailed",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            "critical",
            f"{_GPU} on {_WHERE} failed to remap a memory row",
            "The GPU ran out of spare rows in a bank: the memory error cannot be repaired.",
            labels={"action": "rma"},
        ),
        Alert(
            "GpuThermalThrottling",
            _throttle([_SW_THERMAL, _HW_THERMAL, _HW_SLOWDOWN])
            + " or rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) > 500000",
            "warning",
            f"{_GPU} on {_WHERE} has been thermally throttled for 15 minutes",
            "Clock event reasons show SW/HW thermal slowdown or HW slowdown, or thermal "
            "violation time exceeds half of the time.",
            for_="15m",
        ),
        Alert(
            "GpuPowerBrake",
            _throttle([_HW_POWER_BRAKE]) + " or rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) > 500000",
            "warning",
            f"{_GPU} on {_WHERE} has been power-throttled (power brake) for 15 minutes",
            "The HW power brake slowdown (an external signal from the board or PSU) is held, or "
            "power violation time exceeds half of the time. Running at the software power cap "
            "under load is normal and not alerted.",
            for_="15m",
        ),
        Alert(
            "GpuTemperatureHigh",
            f"DCGM_FI_DEV_GPU_TEMP > {GPU_TEMP_MAX_C} or "
            f"DCGM_FI_DEV_MEMORY_TEMP > {HBM_TEMP_MAX_C}",
            "warning",
            f"{_GPU} on {_WHERE} is at {{{{ $value }}}} °C",
            f"GPU above {GPU_TEMP_MAX_C} °C or memory above {HBM_TEMP_MAX_C} °C for 5 minutes.",
            for_="5m",
        ),
        Alert(
            "GpuPowerAboveLimit",
            "DCGM_FI_DEV_POWER_USAGE > on(cluster, node_type) group_left "
            "gpuforge:gpu_power_limit_watts",
            "warning",
            f"{_GPU} on {_WHERE} draws {{{{ $value }}}} W, above its SKU's limit",
            "The GPU draws more than its SKU's maximum board power for 5 minutes.",
            for_="5m",
        ),
        Alert(
            "NvlinkDown",
            _check("gpu.nvlink"),
            "critical",
            "NVLink down on {{ $labels.node }} (rack {{ $labels.rack }}): a GPU has fewer "
            "active links than its node type",
            "The node's gpu.nvlink check found inactive NVLinks. NCCL falls back or hangs.",
            labels={"action": "reset_gpu"},
        ),
        Alert(
            "IbPortDown",
            "(node_infiniband_state_id != 4 or node_infiniband_physical_state_id != 5) and "
            "on(cluster, node_type, device) gpuforge:ib_port_expected_rate_bytes_per_second",
            "critical",
            f"Fabric {_PORT} on {_WHERE} is down (leaf {{{{ $labels.leaf }}}})",
            "A compute rail port is not ACTIVE/LinkUp for 2 minutes. The node's jobs lose that "
            "rail; NCCL slows or fails.",
            for_="2m",
            labels={"action": "inspect"},
        ),
        Alert(
            "IbPortWrongRate",
            "(node_infiniband_rate_bytes_per_second and node_infiniband_state_id == 4) < "
            "on(cluster, node_type, device) group_left "
            "gpuforge:ib_port_expected_rate_bytes_per_second",
            "warning",
            f"Fabric {_PORT} on {_WHERE} runs at {{{{ $value | humanize }}}}B/s, below its "
            "rail's rate",
            "The port trained at a lower speed or width than the spec's rate for the rail.",
            for_="5m",
            labels={"action": "inspect"},
        ),
        Alert(
            "IbLinkFlapping",
            f"increase(node_infiniband_link_downed_total[12h]) >= {FLAPS_PER_12H} or "
            + _check("fabric.flaps", ">= 1"),
            "warning",
            f"Fabric {_PORT} on {_WHERE} went down {FLAPS_PER_12H}+ times in 12 hours",
            "The link keeps dropping and recovering (gpud's flap definition: 3 downs in 12 h).",
            labels={"action": "inspect"},
        ),
        Alert(
            "IbSymbolErrors",
            f"increase(node_infiniband_symbol_error_total[1h]) > {SYMBOL_ERRORS_PER_HOUR} or "
            + _check("fabric.counters", ">= 1"),
            "warning",
            f"Fabric {_PORT} on {_WHERE}: {{{{ $value }}}} symbol errors in an hour",
            f"More than {SYMBOL_ERRORS_PER_HOUR} symbol errors per hour (a marginal cable or "
            "transceiver), or the node's fabric.counters check warns or fails.",
            labels={"action": "inspect"},
        ),
        Alert(
            "RocePfcPauseStorm",
            _check("fabric.roce_pfc", ">= 1"),
            "warning",
            "RoCE congestion on {{ $labels.node }} (rack {{ $labels.rack }}): PFC pauses or "
            "ECN marks above the limit",
            "The node's fabric.roce_pfc check (ethtool rx/tx_prio<N>_pause and the RDMA "
            "hw_counters np_ecn_marked_roce_packets) found a pause storm or heavy ECN marking. "
            "Debian 12's node_exporter exposes neither, so the alert reads gpuforge's textfile "
            "metric.",
        ),
        Alert(
            "ExporterDown",
            "up == 0 unless on(node) (max by (node) (up) == 0)",
            "warning",
            "Exporter {{ $labels.job }} on {{ $labels.node }} ({{ $labels.instance }}) is down",
            "Prometheus cannot scrape one exporter of a node whose other exporters answer.",
            for_="5m",
        ),
        Alert(
            "NodeDown",
            "max by (cluster, su, rack, node) (up) == 0",
            "critical",
            "Node {{ $labels.node }} (rack {{ $labels.rack }}) is down: no exporter answers",
            "Every exporter of the node has been unreachable for 5 minutes.",
            for_="5m",
        ),
        Alert(
            "GpuforgeHealthCheckFailed",
            f'(gpuforge_health_check_status{{check!~"{_DEDICATED_CHECKS}"}} == 2) '
            "unless on(node, check) (gpuforge_health_check_shadow == 1)",
            "warning",
            "Health check {{ $labels.check }} fails on {{ $labels.node }} "
            "(rack {{ $labels.rack }})",
            "A non-shadow health check fails; after its fail_after streak the node asks the "
            "collector for a drain.",
        ),
        Alert(
            "GpuforgeHealthCheckError",
            "gpuforge_health_check_status == 3",
            "warning",
            "Health check {{ $labels.check }} cannot run on {{ $labels.node }} "
            "(rack {{ $labels.rack }})",
            "The check could not run for 30 minutes (a tool missing or timing out). An error "
            "never drains, so a broken check hides real faults.",
            for_="30m",
        ),
        Alert(
            "GpuforgeNodeDrainedTooLong",
            "max by (cluster, su, rack, node, check, action) "
            "(gpuforge_health_drain_requested) == 1",
            "warning",
            "{{ $labels.node }} (rack {{ $labels.rack }}) has asked to be drained for "
            "{{ $labels.check }} ({{ $labels.action }}) for a day",
            f"A drain requested by gpuforge has been in force for {DRAINED_TOO_LONG}: the "
            "remediation did not run or did not fix the node.",
            for_=DRAINED_TOO_LONG,
        ),
        Alert(
            "GpuforgeHealthStale",
            f'time() - gpuforge_health_last_run_timestamp_seconds{{tier="passive"}} > '
            f"{HEALTH_STALE_S}",
            "warning",
            "Health verdict of {{ $labels.node }} (rack {{ $labels.rack }}) is "
            "{{ $value | humanizeDuration }} old",
            f"The passive health check has not run for {HEALTH_STALE_S // 60} minutes: slurmd's "
            "HealthCheckProgram is not running it, or it hangs.",
            for_="5m",
        ),
        Alert(
            "GpuforgeConformanceDrift",
            "sum by (cluster, su, rack, node) (gpuforge_conformance_drift_items) > 0",
            "warning",
            "{{ $labels.node }} (rack {{ $labels.rack }}) drifted from its desired state "
            "({{ $value }} items)",
            "The nightly conformance run found packages, files, sysctls, modules, services, "
            "limits or firmware differing from what the roles set.",
        ),
        Alert(
            "GpuforgeConformanceStale",
            f"time() - gpuforge_conformance_last_run_timestamp_seconds > {CONFORMANCE_STALE_S}",
            "info",
            "Conformance of {{ $labels.node }} (rack {{ $labels.rack }}) last ran "
            "{{ $value | humanizeDuration }} ago",
            "The nightly conformance job has not covered the node for two days.",
        ),
        Alert(
            "GpuforgeBreakerOpen",
            "gpuforge_health_breaker_open == 1",
            "critical",
            "gpuforge's drain circuit breaker is open on {{ $labels.node }}: automatic drains stop",
            "More nodes asked to be drained than the breaker allows: a fleet-wide cause (a bad "
            "config, a switch, a driver) is likely, not many broken nodes.",
        ),
        Alert(
            "GpuforgeDrainsRefused",
            "increase(gpuforge_health_refused_drains_total[30m]) > 0",
            "warning",
            "The collector on {{ $labels.node }} refused {{ $value }} drain requests in 30 minutes",
            "Admission refused drains (breaker open, maintenance rules): faulty nodes may stay "
            "in service.",
        ),
        Alert(
            "GpuforgeNodeClockSkew",
            # The collector's counter comes from the services host's textfile: Prometheus names
            # the node it counts exported_node (the target's own node label is the collector's).
            "increase(gpuforge_collector_future_records_total[30m]) > 0 or "
            + _check("node.clock", "== 1"),
            "warning",
            "The clock of {{ with $labels.exported_node }}{{ . }}{{ else }}{{ $labels.node }}"
            "{{ end }} is off the collector's: its records are refused as future-dated or its "
            "node.clock check warns",
            "The node's clock is wrong: the collector refused its records as dated more than "
            "max_future_s (300 s) ahead of its own clock, or the node's node.clock check measured "
            f"it more than warn_s ({CLOCK_WARN_S} s) off the collector's. Its records misdate "
            "what they report, and once the clock is off by munge's credential time-to-live "
            "(300 s) every record is refused.",
            labels={"action": "monitor"},
        ),
        Alert(
            "RackPowerOverBudget",
            "gpuforge:rack_power_watts > on(cluster, rack) gpuforge:rack_power_budget_watts",
            "critical",
            "Rack {{ $labels.rack }} draws {{ $value | humanize }}W, above its budget",
            "GPU power plus the node types' base load exceeds the spec's layout.rack_power_kw "
            "for 5 minutes: the rack's breakers or PDUs are at risk.",
            for_="5m",
        ),
    ]
    return out


def fleet_records() -> list[dict[str, str]]:
    """Recording rules for the fleet view (independent of the spec)."""
    healthy_node = (
        '(gpuforge_health_verdict{tier="passive"} <= 1) '
        "unless on(node) (gpuforge_health_drain_requested == 1)"
    )
    fabric_errors = (
        "increase(node_infiniband_symbol_error_total[1h]) "
        "+ increase(node_infiniband_port_errors_received_total[1h]) "
        "+ increase(node_infiniband_link_downed_total[1h])"
    )
    return [
        {
            "record": "gpuforge:node_power_watts",
            "expr": "sum by (cluster, su, rack, node, node_type) (DCGM_FI_DEV_POWER_USAGE) "
            "+ on(cluster, node_type) group_left gpuforge:node_base_power_watts",
        },
        {
            "record": "gpuforge:rack_power_watts",
            "expr": "sum by (cluster, rack) (gpuforge:node_power_watts)",
        },
        {
            "record": "gpuforge:rack_power_budget_ratio",
            "expr": "gpuforge:rack_power_watts "
            "/ on(cluster, rack) gpuforge:rack_power_budget_watts",
        },
        {
            "record": "gpuforge:su_gpus:count",
            "expr": "count by (cluster, su) (DCGM_FI_DEV_GPU_TEMP)",
        },
        {
            "record": "gpuforge:su_gpus_healthy:count",
            "expr": f"count by (cluster, su) (DCGM_FI_DEV_GPU_TEMP and on(node) ({healthy_node}))",
        },
        {
            "record": "gpuforge:su_gpus_drained:count",
            "expr": "count by (cluster, su) (DCGM_FI_DEV_GPU_TEMP and on(node) "
            "(gpuforge_health_drain_requested == 1))",
        },
        {
            "record": "gpuforge:port_fabric_errors:increase1h",
            "expr": fabric_errors,
        },
        {
            "record": "gpuforge:leaf_fabric_errors:increase1h",
            # A rail-optimised fabric has one leaf per rail: the spec's rail->leaf map relabels
            # each port; otherwise the node's own leaf label is the port's leaf.
            "expr": "sum by (cluster, leaf) (gpuforge:port_fabric_errors:increase1h "
            "* on(cluster, su, node_type, device) group_left(leaf) gpuforge:rail_leaf_info) "
            "or sum by (cluster, leaf) (gpuforge:port_fabric_errors:increase1h "
            "unless on(cluster, su, node_type, device) gpuforge:rail_leaf_info)",
        },
    ]


def _gpu_power_w(model: str | None) -> float:
    watts = sku_power_w(model)
    return DEFAULT_GPU_POWER_W if watts is None else watts


def spec_records(cluster: Cluster) -> list[dict[str, Any]]:
    """Recording rules holding what only the spec knows (budgets, expected rates, rail leaves)."""
    spec = cluster.spec
    name = cluster.name
    gpu_nodes = [n for n in cluster.nodes if n.role == "gpu"]
    budget_w = spec.layout.rack_power_kw * 1000
    out: list[dict[str, Any]] = []
    for rack in sorted({n.rack for n in gpu_nodes}):
        out.append(
            {
                "record": "gpuforge:rack_power_budget_watts",
                "expr": f"vector({budget_w:g})",
                "labels": {"cluster": name, "rack": rack},
            }
        )
    types = sorted({n.node_type for n in gpu_nodes})
    for t in types:
        kind = spec.node_types[t]
        gpu_w = _gpu_power_w(kind.gpu_model)
        peak_w = kind.power_kw * 1000
        base_w = max(peak_w - kind.gpus * gpu_w, peak_w * MIN_BASE_FRACTION)
        labels = {"cluster": name, "node_type": t}
        out.append(
            {
                "record": "gpuforge:node_base_power_watts",
                "expr": f"vector({base_w:g})",
                "labels": labels,
            }
        )
        out.append(
            {
                "record": "gpuforge:gpu_power_limit_watts",
                "expr": f"vector({gpu_w:g})",
                "labels": labels,
            }
        )
        for nic in kind.rails:
            if nic.rate_gbps is None:
                continue
            out.append(
                {
                    "record": "gpuforge:ib_port_expected_rate_bytes_per_second",
                    "expr": f"vector({nic.rate_gbps * 1e9 / 8:g})",
                    "labels": {**labels, "device": nic.device},
                }
            )
    rail_leaves: set[tuple[int, str, str, str]] = set()
    if cluster.fabric.rail_optimized:
        for n in gpu_nodes:
            for port in n.rails:
                rail_leaves.add((n.su, n.node_type, port.device, port.leaf))
    for su, t, device, leaf in sorted(rail_leaves):
        out.append(
            {
                "record": "gpuforge:rail_leaf_info",
                "expr": "vector(1)",
                "labels": {
                    "cluster": name,
                    "su": str(su),
                    "node_type": t,
                    "device": device,
                    "leaf": leaf,
                },
            }
        )
    return out


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:  # noqa: ARG002
        # Indented block sequences, as yamllint's default expects.
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:  # noqa: ARG002 - yaml's hook
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

_HEADER = (
    "# Generated by gpuforge.monitoring.rules ({what}); do not edit: change the code or the "
    "spec and regenerate.\n# Runbooks: docs/runbooks/<alert>.md. Metric sources: "
    'docs/monitoring.md, "Rules".\n'
)


def _dump(doc: Mapping[str, Any], what: str) -> str:
    body = _BlockWriter().dump(doc)
    if body is None:
        body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return _HEADER.format(what=what) + "---\n" + body


#: Texts PyYAML writes plain unless its resolver reads them as another type (``yes``, ``1e3``).
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class _BlockWriter:
    """The text ``yaml.dump(doc, Dumper=_Dumper, ...)`` writes, for the documents that are
    block mappings and sequences of short scalars (a spec's recording rules: one rule per rack
    and leaf, 6,000 at 100k GPUs, which PyYAML's pure-Python emitter takes 4 s to write).

    Each scalar's style is PyYAML's own choice (its resolver and scalar analysis, cached per
    value), so the bytes are the same; :meth:`dump` returns None for anything else (a scalar
    with white space, which PyYAML may fold at the line width, an empty collection, a bool), and
    the caller falls back to PyYAML. tests/unit/monitoring/test_rules.py compares the two.
    """

    _STR = "tag:yaml.org,2002:str"

    def __init__(self) -> None:
        self._yaml = _Dumper(io.StringIO(), width=100, allow_unicode=True)
        self._keys: dict[str, str | None] = {}  # each text's style, as a key and as a value
        self._values: dict[str, str | None] = {}

    def dump(self, doc: Mapping[str, Any]) -> str | None:
        out: list[str] = []
        ok = bool(doc) and self._mapping(doc, 0, "", out)
        return "".join(out) if ok else None

    def _scalar(self, value: object, key: bool) -> str | None:
        if type(value) is str:
            styles = self._keys if key else self._values
            if value not in styles:
                styles[value] = self._style(value, key)
            return styles[value]
        if type(value) is int:
            return str(value)
        return None

    def _style(self, value: str, key: bool) -> str | None:
        if not value.isprintable() or " " in value or len(value) >= 120:
            return None
        tag = self._yaml.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
        implicit = tag == self._STR
        if _TOKEN.fullmatch(value):
            # No indicator, space or special character: PyYAML's scalar analysis allows it plain
            # and single-quoted, so its resolver alone decides (a rack or leaf name, 6,000 of
            # them at 100k GPUs, each a pass of that analysis in Python).
            return value if implicit else f"'{value}'"
        analysis = self._yaml.analyze_scalar(value)
        if implicit and analysis.allow_block_plain and not (key and analysis.empty):
            return value
        if analysis.allow_single_quoted:
            return "'" + value.replace("'", "''") + "'"
        return None

    def _mapping(self, data: Mapping[str, Any], indent: int, lead: str, out: list[str]) -> bool:
        pad = " " * indent
        for i, (k, v) in enumerate(data.items()):
            key = self._scalar(k, True)
            if key is None:
                return False
            prefix = (lead if i == 0 else pad) + key + ":"
            if type(v) is dict or isinstance(v, Mapping):
                out.append(prefix + "\n")
                if not v or not self._mapping(v, indent + 2, pad + "  ", out):
                    return False
            elif isinstance(v, list):
                out.append(prefix + "\n")
                if not v or not self._sequence(v, indent + 2, out):
                    return False
            else:
                text = self._scalar(v, False)
                if text is None:
                    return False
                out.append(f"{prefix} {text}\n")
        return True

    def _sequence(self, items: list[Any], indent: int, out: list[str]) -> bool:
        dash = " " * indent + "- "
        for item in items:
            if type(item) is dict or isinstance(item, Mapping):
                if not item or not self._mapping(item, indent + 2, dash, out):
                    return False
                continue
            text = self._scalar(item, False)
            if text is None:
                return False
            out.append(dash + text + "\n")
        return True


def alerts_file(runbook_base: str = RUNBOOK_BASE, cat: XidCatalogue | None = None) -> str:
    """The text of ``gpuforge-alerts.yml`` (alerts and fleet recording rules)."""
    doc = {
        "groups": [
            {"name": "gpuforge-fleet", "rules": fleet_records()},
            {"name": "gpuforge-alerts", "rules": [a.rule(runbook_base) for a in alerts(cat)]},
        ]
    }
    return _dump(doc, "from the Xid catalogue")


def records_file(cluster: Cluster) -> str:
    """The text of ``gpuforge-records.yml`` for ``cluster`` (spec-derived series)."""
    doc = {
        "groups": [
            # Constant series: evaluating them once a minute is plenty.
            {
                "name": f"gpuforge-spec-{cluster.name}",
                "interval": "1m",
                "rules": spec_records(cluster),
            }
        ]
    }
    return _dump(doc, f"from the spec of cluster {cluster.name}")


def render_rules(cluster: Cluster, runbook_base: str = RUNBOOK_BASE) -> dict[str, str]:
    """Prometheus rule files for ``cluster``: ``{file name: YAML text}``."""
    return {ALERTS_FILE: alerts_file(runbook_base), RECORDS_FILE: records_file(cluster)}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuforge.monitoring.rules [--check] [DIR]``: write or compare the alerts file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    parser.add_argument("dir", nargs="?", default="roles/prometheus/files/rules", type=Path)
    args = parser.parse_args(argv)
    path: Path = args.dir / ALERTS_FILE
    text = alerts_file()
    if args.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            sys.stderr.write(f"{path}: not in step with gpuforge.monitoring.rules; regenerate it\n")
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
