"""Simulated RDMA tools: ``ibstat``, ``perfquery``, ``ibv_devinfo`` and perftest's ``ib_write_bw``.

``ib_write_bw`` really exchanges connection data over TCP (port 18515, like perftest's
out-of-band exchange), so a client needs a server started first; the bandwidth comes from the
fabric model in the state file, not from moving data.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from . import SIM_BANNER_RDMA
from .counters import PORT_COUNTERS, port_counters, saturated
from .perf import ib_write_gbps, rail_rate_gbps
from .state import Lab, NodeView, load_lab

CA_TYPE = "MT4129"  # ConnectX-7
VENDOR_PART = "4129"
FW = "28.41.1000"
PERFTEST_PORT = 18515
SERVER_TIMEOUT_S = 120.0


def _port(node: NodeView, rail: int) -> dict[str, Any]:
    r = node.rails[rail]
    eth = r.get("link_layer") == "Ethernet"
    down = bool(node.rail_faults(rail, "ib_port_down"))
    polling = bool(node.rail_faults(rail, "ib_port_polling"))
    rate = rail_rate_gbps(node, rail)
    active = rate > 0
    return {
        "state": "Active" if active else "Down",
        "phys": "LinkUp" if active else ("Polling" if polling else "Disabled"),
        "rate": int(rate) if active else (40 if eth else 10),
        "lid": 0 if (eth or not active) else node.lid(rail),
        "sm_lid": 0 if (eth or not active) else 1,
        "cap": "0x00010000" if eth else "0xa751e848",
        "link_layer": "Ethernet" if eth else "InfiniBand",
        "down": down,
        "guid": node.guid(rail),
    }


def _find_rail(node: NodeView, device: str) -> int | None:
    for i, r in enumerate(node.rails):
        if r["device"] == device:
            return i
    return None


def ibstat_main(argv: list[str]) -> int:
    if "-V" in argv or "--version" in argv:
        print(f"ibstat BUILD VERSION: 44.0 ({SIM_BANNER_RDMA})")
        return 0
    if "-h" in argv or "--help" in argv:
        print(
            f"Usage: ibstat [-d(ebug) -l(ist_of_cas) -s(hort) -p(ort_list) -V(ersion)] "
            f"<ca_name> [portnum]\n({SIM_BANNER_RDMA})"
        )
        return 0
    node = load_lab().local()
    flags = {a for a in argv if a.startswith("-")}
    pos = [a for a in argv if not a.startswith("-")]
    rails = list(range(len(node.rails)))
    if pos:
        rail = _find_rail(node, pos[0])
        if rail is None:
            print(
                f"ibpanic: [{os.getpid()}] main: stat of IB device '{pos[0]}' failed: "
                "No such file or directory",
                file=sys.stderr,
            )
            return 255
        rails = [rail]
    if "-l" in flags:
        for i in rails:
            print(node.rails[i]["device"])
        return 0
    if "-p" in flags:
        for i in rails:
            print(node.guid(i))
        return 0
    out: list[str] = []
    for i in rails:
        p = _port(node, i)
        dev = node.rails[i]["device"]
        if "-s" in flags:
            out += [
                f"CA '{dev}'",
                f"\tCA type: {CA_TYPE}",
                "\tNumber of ports: 1",
                f"\tFirmware version: {FW}",
                "\tHardware version: 0",
                f"\tNode GUID: {p['guid']}",
                f"\tSystem image GUID: {p['guid']}",
            ]
            continue
        out += [
            f"CA '{dev}'",
            f"\tCA type: {CA_TYPE}",
            "\tNumber of ports: 1",
            f"\tFirmware version: {FW}",
            "\tHardware version: 0",
            f"\tNode GUID: {p['guid']}",
            f"\tSystem image GUID: {p['guid']}",
            "\tPort 1:",
            f"\t\tState: {p['state']}",
            f"\t\tPhysical state: {p['phys']}",
            f"\t\tRate: {p['rate']}",
            f"\t\tBase lid: {p['lid']}",
            "\t\tLMC: 0",
            f"\t\tSM lid: {p['sm_lid']}",
            f"\t\tCapability mask: {p['cap']}",
            f"\t\tPort GUID: {p['guid']}",
            f"\t\tLink layer: {p['link_layer']}",
        ]
    print("\n".join(out))
    return 0


def link_downed(node: NodeView, rail: int) -> int:
    """The port's LinkDownedCounter as PortCounters shows it (8 bits wide)."""
    return saturated("link_downed", port_counters(node, rail)["link_downed"])


def perfquery_main(argv: list[str]) -> int:
    """``perfquery [-C ca] [-P port]``: the local port's PortCounters (infiniband-diags format)."""
    if "-V" in argv or "--version" in argv:
        print(f"perfquery BUILD VERSION: 44.0 ({SIM_BANNER_RDMA})")
        return 0
    node = load_lab().local()
    ca = argv[argv.index("-C") + 1] if "-C" in argv[:-1] else None
    port = argv[argv.index("-P") + 1] if "-P" in argv[:-1] else "1"
    rail = _find_rail(node, ca) if ca else (0 if node.rails else None)
    pid = os.getpid()
    if rail is None or port != "1":
        print(
            f"ibwarn: [{pid}] mad_rpc_open_port: can't open UMAD port ({ca}:{port})\n"
            f"perfquery: iberror: [pid {pid}] main: failed: Failed to open '{ca}' port '{port}'",
            file=sys.stderr,
        )
        return 255
    p = _port(node, rail)
    if p["link_layer"] != "InfiniBand" or p["state"] != "Active":
        print(
            f"ibwarn: [{pid}] _do_madrpc: recv failed: Connection timed out\n"
            f"perfquery: iberror: [pid {pid}] main: failed: can't resolve self port {ca}",
            file=sys.stderr,
        )
        return 255
    now = port_counters(node, rail)
    value = {PORT_COUNTERS[k][0]: str(saturated(k, v)) for k, v in now.items()}
    counters = {
        "PortSelect": "1",
        "CounterSelect": "0x0000",
        **{
            k: value[k]
            for k in (
                "SymbolErrorCounter",
                "LinkErrorRecoveryCounter",
                "LinkDownedCounter",
                "PortRcvErrors",
                "PortRcvRemotePhysicalErrors",
                "PortRcvSwitchRelayErrors",
                "PortXmitDiscards",
                "PortXmitConstraintErrors",
                "PortRcvConstraintErrors",
            )
        },
        "CounterSelect2": "0x00",
        "LocalLinkIntegrityErrors": value["LocalLinkIntegrityErrors"],
        "ExcessiveBufferOverrunErrors": value["ExcessiveBufferOverrunErrors"],
        "QP1Dropped": "0",
        "VL15Dropped": value["VL15Dropped"],
        "PortXmitData": value["PortXmitData"],
        "PortRcvData": value["PortRcvData"],
        "PortXmitPkts": value["PortXmitPkts"],
        "PortRcvPkts": value["PortRcvPkts"],
        "PortXmitWait": value["PortXmitWait"],
    }
    print(f"# Port counters: Lid {p['lid']} port 1 (CapMask: 0x5A00)")
    for name, value in counters.items():
        print(f"{name}:".ljust(33, ".") + value)
    return 0


def _colon_guid(guid: str) -> str:
    h = guid[2:].rjust(16, "0")
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def ibv_devinfo_main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv or "--version" in argv:
        print(f"Usage: ibv_devinfo [-d device] [-i port] [-l] [-v]\n({SIM_BANNER_RDMA})")
        return 0
    node = load_lab().local()
    rails = list(range(len(node.rails)))
    verbose = "-v" in argv or "--verbose" in argv
    if "-l" in argv or "--list" in argv:
        print(f"{len(rails)} HCA{'s' if len(rails) != 1 else ''} found:")
        for i in rails:
            print(f"\t{node.rails[i]['device']}")
        return 0
    for flag in ("-d", "--ib-dev"):
        if flag in argv:
            idx = argv.index(flag)
            dev = argv[idx + 1] if idx + 1 < len(argv) else ""
            rail = _find_rail(node, dev)
            if rail is None:
                print(f"IB device '{dev}' wasn't found", file=sys.stderr)
                return 255
            rails = [rail]
    if not rails:
        print("No IB devices found", file=sys.stderr)
        return 255
    out: list[str] = []
    for i in rails:
        p = _port(node, i)
        state = "PORT_ACTIVE (4)" if p["state"] == "Active" else "PORT_DOWN (1)"
        g = _colon_guid(p["guid"])
        out += [
            f"hca_id:\t{node.rails[i]['device']}",
            "\ttransport:\t\t\tInfiniBand (0)",
            f"\tfw_ver:\t\t\t\t{FW}",
            f"\tnode_guid:\t\t\t{g}",
            f"\tsys_image_guid:\t\t\t{g}",
            "\tvendor_id:\t\t\t0x02c9",
            f"\tvendor_part_id:\t\t\t{VENDOR_PART}",
            "\thw_ver:\t\t\t\t0x0",
            "\tboard_id:\t\t\tMT_0000000838",
            "\tphys_port_cnt:\t\t\t1",
            "\t\tport:\t1",
            f"\t\t\tstate:\t\t\t{state}",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            f"\t\t\tactive_mtu:\t\t{'4096 (5)' if p['state'] == 'Active' else '1024 (3)'}",
            f"\t\t\tsm_lid:\t\t\t{p['sm_lid']}",
            f"\t\t\tport_lid:\t\t{p['lid']}",
            "\t\t\tport_lmc:\t\t0x00",
            f"\t\t\tlink_layer:\t\t{p['link_layer']}",
        ]
        if verbose:
            phys = {"LinkUp": "LINK_UP (5)", "Polling": "POLLING (2)", "Disabled": "DISABLED (3)"}
            speed = {400: "100.0 Gbps (64)", 200: "50.0 Gbps (32)", 100: "25.0 Gbps (32)"}
            out += [
                "\t\t\tmax_msg_sz:\t\t0x40000000",
                "\t\t\tactive_width:\t\t4X (2)",
                f"\t\t\tactive_speed:\t\t{speed.get(p['rate'], '2.5 Gbps (1)')}",
                f"\t\t\tphys_state:\t\t{phys[p['phys']]}",
            ]
        out.append("")
    print("\n".join(out))
    return 0


# ---- ib_write_bw ------------------------------------------------------------------------------


def _wb_args(argv: list[str]) -> dict[str, Any]:  # noqa: PLR0912 - one branch per option
    a: dict[str, Any] = {
        "device": None,
        "port": PERFTEST_PORT,
        "size": 65536,
        "iters": 5000,
        "gbits": False,
        "all": False,
        "duration": None,
        "qps": 1,
        "server": None,
    }
    takes = {
        "-d",
        "--ib-dev",
        "-p",
        "--port",
        "-s",
        "--size",
        "-n",
        "--iters",
        "-D",
        "--duration",
        "-q",
        "--qp",
        "-x",
        "--gid-index",
        "-i",
        "--ib-port",
        "-m",
        "--mtu",
        "--source_ip",
        "-t",
        "--tx-depth",
        "-c",
        "--connection",
        "-F",
        "--CPU-freq",
    }
    no_value = {"-F", "--CPU-freq"}
    i = 0
    while i < len(argv):
        tok = argv[i]
        key, val = tok, None
        if tok.startswith("--") and "=" in tok:
            key, val = tok.split("=", 1)
        if key in ("--report_gbits",):
            a["gbits"] = True
        elif key in ("-a", "--all"):
            a["all"] = True
        elif key in takes and key not in no_value:
            if val is None:
                i += 1
                val = argv[i] if i < len(argv) else ""
            if key in ("-d", "--ib-dev"):
                a["device"] = val
            elif key in ("-p", "--port"):
                a["port"] = int(val)
            elif key in ("-s", "--size"):
                a["size"] = int(val)
            elif key in ("-n", "--iters"):
                a["iters"] = int(val)
            elif key in ("-D", "--duration"):
                a["duration"] = float(val)
            elif key in ("-q", "--qp"):
                a["qps"] = int(val)
        elif not tok.startswith("-"):
            a["server"] = tok
        i += 1
    return a


def _banner(dev: str, link: str, qps: int, client: bool) -> list[str]:
    dash = "-" * 87
    lines = [
        dash,
        "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {dev}",
        f" Number of qps   : {qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON",
        " ibv_wr* API     : ON",
    ]
    if client:
        lines.append(" TX depth        : 128")
    lines += [
        " CQ Moderation   : 1",
        " Mtu             : 4096[B]",
        f" Link type       : {'IB' if link == 'InfiniBand' else 'Ethernet'}",
    ]
    if link != "InfiniBand":
        lines.append(" GID index       : 3")
    lines += [
        " Max inline data : 0[B]",
        " rdma_cm QPs\t : OFF",
        " Data ex. method : Ethernet",
        dash,
    ]
    return lines


def _addr(node: NodeView, rail: int, salt: str) -> str:
    rng = node.rng("qp", rail, salt)
    lid = node.lid(rail) if node.rails[rail].get("link_layer") != "Ethernet" else 0
    return (
        f"LID {lid:#06x} QPN {rng.randint(0x100, 0xFFFF):#06x} PSN {rng.randint(0, 0xFFFFFF):#08x} "
        f"RKey {rng.randint(0, 0xFFFFFF):#08x} "
        f"VAddr {0x007F0000000000 + rng.randint(0, 0xFFFFFFFF):#016x}"
    )


def _results(a: dict[str, Any], gbps: float, rng_node: NodeView, rail: int) -> list[str]:
    unit = "Gb/sec" if a["gbits"] else "MB/sec"
    lines = [f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"]
    sizes = [2**k for k in range(1, 24)] if a["all"] else [a["size"]]
    rng = rng_node.rng("ib_write_bw", rail, a["size"], a["all"])
    for size in sizes:
        # Small messages are message-rate bound (~ 10 Mpps per QP on CX-7).
        cap = size * 8 * 10e6 * a["qps"] / 1e9
        avg = min(gbps, cap) * (1 + rng.uniform(-0.006, 0.006))
        peak = avg * (1 + rng.uniform(0, 0.003))
        mpps = avg * 1e9 / 8 / size / 1e6 if size else 0.0
        shown_avg = avg if a["gbits"] else avg * 1e9 / 8 / 1e6
        shown_peak = peak if a["gbits"] else peak * 1e9 / 8 / 1e6
        iters = a["iters"]
        lines.append(
            f" {size:<7}    {iters:<7}          {shown_peak:<7.2f}            {shown_avg:<7.2f}"
            f"\t\t   {mpps:<7.6f}"
        )
    lines.append("-" * 87)
    return lines


def _resolve_server(lab: Lab, target: str) -> str:
    """A rail address maps to its node's hostname (rail networks are not plumbed in the lab)."""
    for host, raw in lab.doc.get("nodes", {}).items():
        for r in raw.get("rails", []):
            if str(r.get("address", "")).split("/")[0] == target:
                return str(host)
    return target


def ib_write_bw_main(argv: list[str]) -> int:  # noqa: PLR0911, PLR0915 - server and client
    if "-h" in argv or "--help" in argv or "--version" in argv:
        print(f"ib_write_bw (perftest 4.5) -- {SIM_BANNER_RDMA}")
        print("Usage: ib_write_bw [-d dev] [-s size] [-D sec] [--report_gbits] [-a] [server]")
        return 0
    a = _wb_args(argv)
    lab = load_lab()
    node = lab.local()
    dev = a["device"] or (node.rails[0]["device"] if node.rails else "")
    rail = _find_rail(node, dev)
    if rail is None:
        print(f" Couldn't find device {dev}" if dev else " Did not detect devices", file=sys.stderr)
        print(" Unable to find the Infiniband/RoCE device", file=sys.stderr)
        return 1
    port = _port(node, rail)
    if port["state"] != "Active":
        print(" Port number 1 state is Down", file=sys.stderr)
        print(" Couldn't set the link layer", file=sys.stderr)
        print(" Couldn't get context for the device", file=sys.stderr)
        return 1
    hello = {"host": node.hostname, "device": dev}
    if a["server"] is None:
        print("\n************************************")
        print("* Waiting for client to connect... *")
        print("************************************")
        sys.stdout.flush()
        with socket.create_server(("", a["port"]), reuse_port=False) as srv:
            srv.settimeout(SERVER_TIMEOUT_S)
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                print(" Timed out waiting for a client", file=sys.stderr)
                return 1
            with conn:
                conn.settimeout(30)
                peer = json.loads(conn.makefile().readline())
                conn.sendall((json.dumps(hello) + "\n").encode())
        peer_node = lab.node(peer["host"])
        peer_rail = _find_rail(peer_node, peer["device"]) or 0
        gbps = ib_write_gbps(lab, node, rail, peer_node, peer_rail)
        out = _banner(dev, port["link_layer"], a["qps"], client=False)
        out += [
            f" local address: {_addr(node, rail, 'srv')}",
            f" remote address: {_addr(peer_node, peer_rail, 'cli')}",
            "-" * 87,
        ]
        out += _results(a, gbps, node, rail)
        print("\n".join(out))
        return 0
    target = _resolve_server(lab, a["server"])
    try:
        with socket.create_connection((target, a["port"]), timeout=10) as conn:
            conn.sendall((json.dumps(hello) + "\n").encode())
            conn.settimeout(30)
            peer = json.loads(conn.makefile().readline())
    except OSError:
        print(f" Couldn't connect to {a['server']}:{a['port']}", file=sys.stderr)
        print(
            "Unable to open file descriptor for socket connection Unable to init the socket "
            "connection",
            file=sys.stderr,
        )
        return 1
    peer_node = lab.node(peer["host"])
    peer_rail = _find_rail(peer_node, peer["device"]) or 0
    gbps = ib_write_gbps(lab, node, rail, peer_node, peer_rail)
    out = _banner(dev, port["link_layer"], a["qps"], client=True)
    out += [
        f" local address: {_addr(node, rail, 'cli')}",
        f" remote address: {_addr(peer_node, peer_rail, 'srv')}",
        "-" * 87,
    ]
    out += _results(a, gbps, node, rail)
    lab.sleep(a["duration"] or 5.0)
    print("\n".join(out))
    return 0
