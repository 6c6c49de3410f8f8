"""perfquery PortCounters and kernel-log link down/up lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from tests.unit.conftest import real_fixture

from gpuforge.validate.parsers import ParseError, link_events, perfquery

# perfquery's own layout (rdma-core infiniband-diags/perfquery.c: header, then libibmad's
# mad_dump_perfcounters "Name:....value" lines), as printed for a ConnectX-4 port.
PERFQUERY = """# Port counters: Lid 1 port 1 (CapMask: 0x1600)
PortSelect:......................1
CounterSelect:...................0x0000
SymbolErrorCounter:..............0
LinkErrorRecoveryCounter:........0
LinkDownedCounter:...............4
PortRcvErrors:...................0
PortRcvRemotePhysicalErrors:.....0
PortRcvSwitchRelayErrors:........0
PortXmitDiscards:................0
PortXmitConstraintErrors:........0
PortRcvConstraintErrors:.........0
CounterSelect2:..................0x00
LocalLinkIntegrityErrors:........0
ExcessiveBufferOverrunErrors:....0
QP1Dropped:......................0
VL15Dropped:.....................0
PortXmitData:....................16576648
PortRcvData:.....................7669
PortXmitPkts:....................32009
PortRcvPkts:.....................1012
PortXmitWait:....................441
"""

NOW = datetime(2025, 8, 17, 12, 0, tzinfo=UTC)


def test_perfquery_reads_the_link_downed_counter() -> None:
    got = perfquery.parse(PERFQUERY)
    assert (got.port, got.target, got.link_downed) == (1, "Lid 1", 4)
    assert got.counters["PortXmitWait"] == 441
    assert got.counters["CounterSelect"] == 0


def test_perfquery_refuses_other_output() -> None:
    with pytest.raises(ParseError, match="header"):
        perfquery.parse("CA 'mlx5_0'\n\tCA type: MT4129\n")
    with pytest.raises(ParseError, match="line 3"):
        perfquery.parse("# Port counters: Lid 1 port 1 (CapMask: 0x1600)\nPortSelect:....1\nbad\n")


def test_networkd_carrier_lines_from_a_real_syslog() -> None:
    # Azure's health checks sample: ib6 lost carrier 6 times, gained it 6 times, on Aug 17.
    events = link_events.parse(real_fixture("ib/aznhc-syslog-ib6-lost-carrier-flaps.txt"), now=NOW)
    assert [e.up for e in events] == [False] * 6 + [True] * 6
    assert {e.netdev for e in events} == {"ib6"}
    assert events[0].time == datetime(2025, 8, 17, 6, 18, 1, tzinfo=UTC)


def test_mlx5_link_lines_in_every_time_format() -> None:
    boot = NOW - timedelta(hours=1)
    text = "\n".join(
        [
            "[ 2929.428680] mlx5_core 0000:08:00.7 ens9f0v5: Link down",
            "2025-08-17T11:59:00,123456+00:00 mlx5_core 0000:04:00.0 enp4s0f0np0: Link up",
            "kern  :info  : 2025-08-17T11:59:30,000001+00:00 mlx5_core 0000:04:00.0 ib0: Link down",
            "2025-08-17T11:59:40+0000 node01 kernel: mlx5_core 0000:04:00.0 ib0: Link up",
            "mlx5_core 0000:04:00.0 ib1: Link down",
            "mlx5_core 0000:04:00.0: firmware version: 28.41.1000",
        ]
    )
    events = link_events.parse(text, now=NOW, boot=boot)
    assert [(e.netdev, e.up) for e in events] == [
        ("ens9f0v5", False),
        ("enp4s0f0np0", True),
        ("ib0", False),
        ("ib0", True),
        ("ib1", False),
    ]
    assert events[0].time == boot + timedelta(seconds=2929.42868)
    assert events[1].time == datetime(2025, 8, 17, 11, 59, 0, 123456, tzinfo=UTC)
    assert events[3].time == datetime(2025, 8, 17, 11, 59, 40, tzinfo=UTC)
    assert events[4].time is None
