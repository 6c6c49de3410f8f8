"""Compute fabric: IB/RoCE ports, MTUs, sysctls and nccl.conf, against the fabric roles' files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuforge.validate import checks, flaps
from gpuforge.validate.acceptance import Inconclusive, parse_or_inconclusive
from gpuforge.validate.parsers import ibstat, link_events, perfquery


def _rails(node: Any) -> list[dict[str, Any]]:
    fabric = node.expected_fabric()
    rails = fabric.get("rails") or node.node_type.get("rails") or []
    return [dict(r) for r in rails]


def _rail(node: Any, index: int) -> dict[str, Any]:
    # ``rail`` runs to the largest rail count among the nodes under test (conftest.py): only a
    # batch mixing node types has nodes with fewer.
    rails = _rails(node)
    if index >= len(rails):
        pytest.skip(f"node has {len(rails)} rails")
    return rails[index]


def _fabric_kind(node: Any) -> str:
    return str(node.expected_fabric().get("kind") or node.vars.get("fabric_kind") or "infiniband")


def _link_layer(node: Any, spec: dict[str, Any]) -> str:
    return str(
        spec.get("link_layer") or ("Ethernet" if _fabric_kind(node) == "roce" else "InfiniBand")
    )


def test_port(node: Any, record: Any, rail: int) -> None:
    spec = _rail(node, rail)
    res = node.output("ibstat")
    report = parse_or_inconclusive(ibstat.parse, res)
    rate = float(spec.get("rate_gbps") or node.vars.get("fabric_rate_gbps") or 400)
    layer = _link_layer(node, spec)
    [(_device, outcome)] = checks.ib_ports(report, [spec], rate_gbps=rate, link_layer=layer)
    record.check(f"fabric.port[{rail}]", outcome, res.evidence())


def test_mtu(node: Any, record: Any, rail: int) -> None:
    spec = _rail(node, rail)
    if not spec.get("mtu") or not spec.get("netdev"):
        pytest.skip("no MTU expectation for this rail")
    netdev = str(spec["netdev"])
    res = node.output(f"cat /sys/class/net/{netdev}/mtu")
    layer = _link_layer(node, spec)
    outcome = checks.mtu_matches(res.stdout, int(spec["mtu"]), link_layer=layer)
    record.check(f"fabric.mtu[{rail}]", outcome, res.evidence())


def test_sysctls(node: Any, record: Any) -> None:
    expected = node.expected_fabric().get("sysctls") or {}
    if not expected:
        pytest.skip("no /etc/gpuforge/expected/fabric.json sysctls")
    keys = " ".join(sorted(expected))
    res = node.output(f"sysctl -e {keys}")  # -e: a missing key is reported below, not an error
    live = checks.parse_kv(res.stdout)
    if checks.sysctl_values(live, expected).ok or not _proc_sys_read_only(node):
        record.check("fabric.sysctls", checks.sysctl_conformance(live, expected), res.evidence())
        return
    persisted = node.output("cat /etc/sysctl.d/*.conf")
    # A leading "-" in sysctl.d means "ignore if absent"; later files win, as at boot.
    at_boot = {k.lstrip("-"): v for k, v in checks.parse_kv(persisted.stdout).items()}
    outcome = checks.sysctl_conformance(live, expected, read_only=True, at_boot=at_boot)
    record.check("fabric.sysctls", outcome, f"{res.evidence()}\n{persisted.evidence()}")


def _proc_sys_read_only(node: Any) -> bool:
    """Whether /proc/sys is mounted read-only (asked once per node: the output is cached)."""
    res = node.output("findmnt -n -o OPTIONS /proc/sys")
    return "ro" in res.stdout.strip().split(",")


def test_nccl_conf(node: Any, record: Any) -> None:
    f = node.host.file("/etc/gpuforge/expected/nccl.json")
    if not f.exists:
        pytest.skip("no /etc/gpuforge/expected/nccl.json")
    spec = json.loads(f.content_string)
    path = str(spec.get("path") or "/etc/nccl.conf")
    res = node.output(f"cat {path}")
    outcome = checks.sysctl_values(checks.parse_kv(res.stdout), dict(spec.get("settings") or {}))
    record.check("fabric.nccl_conf", outcome, res.evidence())


# Dated kernel log: dmesg's ISO stamps, or the journal's when dmesg is not readable.
KERNEL_LOG_DATED = "dmesg --time-format iso 2>/dev/null || journalctl -k -b --no-pager -o short-iso"


def test_flaps(node: Any, record: Any, rail: int) -> None:
    """Down/up cycles of the rail's port in the last 12 h: kernel log and LinkDownedCounter."""
    spec = _rail(node, rail)
    netdev = str(spec.get("netdev") or "")
    if not netdev:
        pytest.skip("no netdev for this rail")
    clock = node.output("date -u +%s && cat /proc/uptime")
    try:
        epoch, uptime = float(clock.stdout.split()[0]), float(clock.stdout.split()[1])
    except (IndexError, ValueError) as exc:
        raise Inconclusive(f"cannot read the clock and uptime: {clock.evidence()}") from exc
    now = datetime.fromtimestamp(epoch, UTC)
    boot = now - timedelta(seconds=uptime)
    log = node.output(KERNEL_LOG_DATED)
    events = [e for e in link_events.parse(log.stdout, now=now, boot=boot) if e.netdev == netdev]
    evidence = [e.text for e in events] or [f"no Link down/up line for {netdev} in the kernel log"]
    link_downed = None
    device = str(spec.get("device") or "")
    if _fabric_kind(node) != "roce" and device:
        # PortCounters are read over MADs: InfiniBand only (RoCE ports answer none), and only
        # from a port that is up (fabric.port fails a down one).
        if _port_active(node, device):
            counters = node.output(f"perfquery -C {device} -P 1")
            link_downed = parse_or_inconclusive(perfquery.parse, counters).link_downed
            evidence.append(f"{device} port 1 LinkDownedCounter: {link_downed}")
        else:
            evidence.append(f"{device} port 1 is not Active: LinkDownedCounter not read")
    outcome = flaps.judge_port(events, netdev, now=now, boot=boot, link_downed=link_downed)
    record.check(f"fabric.flaps[{rail}]", outcome, "\n".join(evidence))


def _port_active(node: Any, device: str) -> bool:
    report = parse_or_inconclusive(ibstat.parse, node.output("ibstat"))
    try:
        ports = report.ca(device).ports
    except KeyError:
        return False
    return any(p.state == "Active" for p in ports)
