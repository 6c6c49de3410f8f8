"""InfiniBand: ``ibstat``, ``ibv_devinfo`` and perftest ``ib_write_bw``."""

from __future__ import annotations

import pytest

from gpuforge.validate.parsers import ParseError, ib_write_bw, ibstat, ibv_devinfo

from ._real import real_text

# ibstat ------------------------------------------------------------------------------------

IBSTAT_FACTS = [
    # file, CAs, (InfiniBand ports, Ethernet ports), active ports, rate of mlx5_0
    ("gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt", 9, (8, 1), 9, 400.0),
    ("gpud-ibstat-h100-node-cx7-ndr400-ib-cx6dx-ports-down.txt", 12, (8, 4), 9, 400.0),
    ("gpud-ibstat-h100-node-cx7-400-roce-all-active.txt", 12, (0, 12), 12, 400.0),
    ("gpud-ibstat-a100-node-mt4126-200.txt", 9, (8, 1), 9, 200.0),
    ("gpud-ibstat-a100-azure-hdr200-ibpanic-failure.txt", 8, (8, 0), 8, 200.0),
]
IDS = [f[0] for f in IBSTAT_FACTS]


def _ibstat(name: str) -> ibstat.IbstatReport:
    return ibstat.parse(real_text(f"ib/{name}"))


@pytest.mark.parametrize(("name", "cas"), [(f[0], f[1]) for f in IBSTAT_FACTS], ids=IDS)
def test_ibstat_ca_count(name: str, cas: int) -> None:
    assert len(_ibstat(name).cas) == cas


@pytest.mark.parametrize(("name", "layers"), [(f[0], f[2]) for f in IBSTAT_FACTS], ids=IDS)
def test_ibstat_link_layers(name: str, layers: tuple[int, int]) -> None:
    ports = [p for ca in _ibstat(name).cas for p in ca.ports]
    assert sum(p.link_layer == "InfiniBand" for p in ports) == layers[0]
    assert sum(p.link_layer == "Ethernet" for p in ports) == layers[1]


@pytest.mark.parametrize(("name", "active"), [(f[0], f[3]) for f in IBSTAT_FACTS], ids=IDS)
def test_ibstat_active_ports(name: str, active: int) -> None:
    ports = [p for ca in _ibstat(name).cas for p in ca.ports]
    assert sum(p.state == "Active" and p.physical_state == "LinkUp" for p in ports) == active


@pytest.mark.parametrize(("name", "rate"), [(f[0], f[4]) for f in IBSTAT_FACTS], ids=IDS)
def test_ibstat_rate(name: str, rate: float) -> None:
    assert _ibstat(name).ca("mlx5_0").ports[0].rate_gbps == rate


def test_ibstat_ports_down() -> None:
    report = _ibstat("gpud-ibstat-h100-node-cx7-ndr400-ib-cx6dx-ports-down.txt")
    down = [ca.name for ca in report.cas if ca.ports[0].state == "Down"]
    assert down == ["mlx5_2", "mlx5_7", "mlx5_8"]
    port = report.ca("mlx5_2").ports[0]
    assert (port.physical_state, port.rate_gbps) == ("Disabled", 40.0)


def test_ibstat_ca_values() -> None:
    ca = _ibstat("gpud-ibstat-h100-node-cx7-ndr400-ib-cx6dx-ports-down.txt").ca("mlx5_0")
    assert (ca.ca_type, ca.firmware_version, ca.number_of_ports) == ("MT4129", "28.39.1002", 1)
    port = ca.ports[0]
    assert (port.base_lid, port.sm_lid, port.lmc) == (75, 334, 0)
    assert port.port_guid == "0x946dae0300cde72c"


def test_ibstat_bond_device() -> None:
    ca = _ibstat("gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt").ca("mlx5_bond_0")
    assert ca.ca_type == "MT41692"
    assert ca.ports[0].link_layer == "Ethernet"
    assert ca.ports[0].rate_gbps == 200.0


def test_ibstat_ibpanic_is_an_error_not_silence() -> None:
    report = _ibstat("gpud-ibstat-a100-azure-hdr200-ibpanic-failure.txt")
    assert report.errors == (
        "ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory",
    )
    assert report.warnings


def test_ibstat_unknown_line_names_it() -> None:
    text = real_text("ib/gpud-ibstat-a100-node-mt4126-200.txt").replace(
        "Link layer: InfiniBand", "Link layer InfiniBand", 1
    )
    with pytest.raises(ParseError, match="not an 'ibstat' line") as caught:
        ibstat.parse(text)
    assert caught.value.line is not None


# ibv_devinfo -------------------------------------------------------------------------------


def test_ibv_devinfo_h200_vfs() -> None:
    info = ibv_devinfo.parse(
        real_text("ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt")
    )
    assert len(info.hcas) == 9
    ib = [h for h in info.hcas if h.ports[0].link_layer == "InfiniBand"]
    assert len(ib) == 8
    assert {h.ports[0].state for h in ib} == {"Active"}
    assert {h.fw_ver for h in ib} == {"28.40.1702"}
    assert info.hcas[0].ports[0].port_lid == 1227
    assert info.hcas[-1].name == "mlx5_an0"
    assert info.hcas[-1].vendor_part_id == "4122"


def test_ibv_devinfo_plain_output_has_no_rate() -> None:
    info = ibv_devinfo.parse(
        real_text("ib/azh200doc-ibv_devinfo-ndv5-h200-cx7-vf-8x-ib-plus-an0.txt")
    )
    assert {h.ports[0].rate_gbps for h in info.hcas} == {None}


def test_ibv_devinfo_old_layout_ports_down() -> None:
    info = ibv_devinfo.parse(
        real_text("ib/idx41237316056-ibv_devinfo-mixed-cx4lx-cx5-cx6hdr-ports-down.txt")
    )
    assert len(info.hcas) == 8
    assert sum(h.ports[0].state == "Down" for h in info.hcas) == 5
    hdr = next(h for h in info.hcas if h.name == "mlx5_5")
    assert (hdr.vendor_part_id, hdr.ports[0].link_layer, hdr.ports[0].port_lid) == (
        "4123",
        "InfiniBand",
        18,
    )
    assert info.hcas[0].ports[0].state_raw == "PORT_DOWN (1)"
    assert info.hcas[0].ports[0].active_mtu == 1024


def test_ibv_devinfo_verbose_rate() -> None:
    text = (
        "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tphys_port_cnt:\t\t\t1\n"
        "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tactive_width:\t\t4X (2)\n"
        "\t\t\tactive_speed:\t\t100.0 Gbps (128)\n\t\t\tphys_state:\t\tLINK_UP (5)\n"
        "\t\t\tlink_layer:\t\tInfiniBand\n"
    )
    port = ibv_devinfo.parse(text).hcas[0].ports[0]
    assert port.rate_gbps == 400.0
    assert port.physical_state == "LINK_UP"


def test_ibv_devinfo_no_devices_is_refused() -> None:
    with pytest.raises(ParseError, match="no RDMA device"):
        ibv_devinfo.parse("No IB devices found\n")


# ib_write_bw -------------------------------------------------------------------------------


def test_ib_write_bw_mb_per_second_converted() -> None:
    result = ib_write_bw.parse(real_text("ib/superbench-ib_write_bw-loopback-8M.txt"))
    assert result.unit == "MB/sec"
    assert result.sides == 2
    assert len(result.rows) == 1  # server and client print the same row once each
    row = result.rows[0]
    assert (row.size_bytes, row.iterations, row.bw_average) == (8388608, 20000, 24056.72)
    assert row.bw_average_gbps == pytest.approx(24056.72 * 1048576 * 8 / 1e9, abs=1e-3)
    assert (result.device, result.link_type, result.mtu) == ("ib0", "IB", "4096[B]")


def test_ib_write_bw_interleaved_sweep() -> None:
    result = ib_write_bw.parse(real_text("ib/superbench-ib_write_bw-loopback-all-sizes.txt"))
    assert [r.size_bytes for r in result.rows] == [2**n for n in range(1, 24)]
    assert result.sides == 2
    assert result.rows[-1].bw_average == 23240.68
    assert result.test == "RDMA_Write BW Test"


def test_ib_write_bw_gbits_and_message_rate() -> None:
    result = ib_write_bw.parse(real_text("ib/perftest-issue273-ib_write_bw-postlist-8B-roce.txt"))
    assert result.unit == "Gb/sec"
    assert result.link_type == "Ethernet"
    row = result.rows[0]
    assert (row.bw_peak, row.bw_average, row.msg_rate_mpps) == (0.0, 0.48, 7.498617)
    assert row.bw_average_gbps == 0.48


def test_ib_write_bw_failure_without_rows_is_refused() -> None:
    text = (
        "                    RDMA_Write BW Test\n"
        " Device         : mlx5_0\n"
        "Couldn't connect to 10.0.0.2:18515\n"
        "Unable to open file descriptor for socket connection Unable to init the socket\n"
    )
    with pytest.raises(ParseError, match="Couldn't connect"):
        ib_write_bw.parse(text)


def test_ib_write_bw_unknown_unit_names_its_line() -> None:
    text = " #bytes     #iterations    BW peak[KB/sec]    BW average[KB/sec]   MsgRate[Mpps]\n"
    with pytest.raises(ParseError, match="unknown bandwidth unit") as caught:
        ib_write_bw.parse(text)
    assert caught.value.line == 1
