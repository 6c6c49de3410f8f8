"""``ibv_devinfo`` (and ``ibv_devinfo -v``): HCAs, ports, state, link layer and, with ``-v``, rate.

Reads the rdma-core layout (TABs) and the older MLNX_OFED layout (``Device ports:`` sub-header,
spaces). Plain ``ibv_devinfo`` prints no speed: ``rate_gbps`` is then None, never a guess;
``ibv_devinfo -v`` prints ``active_width`` and ``active_speed``, from which the rate is computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    require_text,
    split_lines,
)

_HCA = re.compile(r"^hca_id:\s*(\S+)\s*$")
_PORT = re.compile(r"^port:\s*(\d+)\s*$")
_KEY_VALUE = re.compile(r"^([A-Za-z_][\w ]*?)\s*:\s*(.*?)\s*$")
_CODED = re.compile(r"^(.*?)\s*\((\d+)\)$")
_STATE_NAMES = {
    "PORT_ACTIVE": "Active",
    "PORT_ACTIVE_DEFER": "Active",
    "PORT_DOWN": "Down",
    "PORT_INIT": "Initializing",
    "PORT_ARMED": "Armed",
    "PORT_NOP": "Nop",
}
_WIDTH = re.compile(r"^(\d+)X")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?)\s*Gbps")


@dataclass(frozen=True, slots=True)
class IbvPort:
    """One port of an HCA."""

    port: int
    state: str | None
    """Normalized like ``ibstat``: ``Active``, ``Down``, ``Initializing``, ``Armed``."""
    state_raw: str | None
    """As printed, ``PORT_ACTIVE (4)``."""
    physical_state: str | None
    """``-v`` only: ``LINK_UP``, ``POLLING``, ``DISABLED``, ..."""
    max_mtu: int | None
    active_mtu: int | None
    sm_lid: int | None
    port_lid: int | None
    link_layer: str | None
    active_width: str | None
    active_speed: str | None
    rate_gbps: float | None
    """width x lane speed when ``-v`` printed both; None otherwise."""


@dataclass(frozen=True, slots=True)
class IbvHca:
    """One HCA (``mlx5_0``)."""

    name: str
    transport: str | None
    fw_ver: str | None
    node_guid: str | None
    sys_image_guid: str | None
    vendor_id: str | None
    vendor_part_id: str | None
    hw_ver: str | None
    board_id: str | None
    phys_port_cnt: int | None
    ports: tuple[IbvPort, ...]


@dataclass(frozen=True, slots=True)
class IbvDevinfo:
    """All HCAs ``ibv_devinfo`` printed."""

    hcas: tuple[IbvHca, ...]
    warnings: tuple[str, ...]


def _leading_int(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"^(\d+)", value)
    return int(match[1]) if match else None


def _port(number: int, values: dict[str, str]) -> IbvPort:
    state_raw = values.get("state")
    state = None
    if state_raw is not None:
        match = _CODED.match(state_raw)
        name = match[1] if match else state_raw
        state = _STATE_NAMES.get(name, name)
    phys = values.get("phys_state")
    if phys is not None and (match := _CODED.match(phys)):
        phys = match[1]
    width = values.get("active_width")
    speed = values.get("active_speed")
    rate = None
    if width and speed and (w := _WIDTH.match(width)) and (s := _SPEED.match(speed)):
        rate = int(w[1]) * float(s[1])
    return IbvPort(
        port=number,
        state=state,
        state_raw=state_raw,
        physical_state=phys,
        max_mtu=_leading_int(values.get("max_mtu")),
        active_mtu=_leading_int(values.get("active_mtu")),
        sm_lid=_leading_int(values.get("sm_lid")),
        port_lid=_leading_int(values.get("port_lid")),
        link_layer=values.get("link_layer"),
        active_width=width,
        active_speed=speed,
        rate_gbps=rate,
    )


def parse(text: str) -> IbvDevinfo:
    """Parse ``ibv_devinfo`` output; raise ParseError on lines it does not know."""
    require_text(text, "ibv_devinfo")
    refuse_other_tool(text, "ibv_devinfo")
    hcas: list[IbvHca] = []
    warnings: list[str] = []
    name: str | None = None
    values: dict[str, str] = {}
    ports: list[IbvPort] = []
    port: int | None = None
    port_values: dict[str, str] = {}

    def close_port() -> None:
        nonlocal port
        if port is not None:
            # ibv_devinfo prints link_layer for every port (after state and MTUs): a port
            # without it is where the output was cut.
            if "link_layer" not in port_values:
                warnings.append(f"HCA {name} port {port}: no link_layer line: the output is cut")
            ports.append(_port(port, port_values))
            port = None

    def close_hca() -> None:
        close_port()
        if name is None:
            return
        count = _leading_int(values.get("phys_port_cnt"))
        if count is None:
            warnings.append(f"HCA {name}: no phys_port_cnt line: the output is cut")
        elif count != len(ports):
            warnings.append(f"HCA {name}: phys_port_cnt {count} but {len(ports)} port(s) listed")
        hcas.append(
            IbvHca(
                name=name,
                transport=values.get("transport"),
                fw_ver=values.get("fw_ver"),
                node_guid=values.get("node_guid"),
                sys_image_guid=values.get("sys_image_guid"),
                vendor_id=values.get("vendor_id"),
                vendor_part_id=values.get("vendor_part_id"),
                hw_ver=values.get("hw_ver"),
                board_id=values.get("board_id"),
                phys_port_cnt=count,
                ports=tuple(ports),
            )
        )

    for lineno, raw in enumerate(split_lines(text), start=1):
        line = raw.strip()
        if not line or line == "Device ports:":
            continue
        if line.startswith("No IB devices found"):
            raise ParseError("ibv_devinfo found no RDMA device", line=lineno, text=raw)
        if match := _HCA.match(line):
            close_hca()
            name, values, ports = match[1], {}, []
            continue
        if name is None:
            raise ParseError("expected an 'hca_id: mlx5_N' line", line=lineno, text=raw)
        if match := _PORT.match(line):
            close_port()
            port, port_values = int(match[1]), {}
            continue
        match = _KEY_VALUE.match(line)
        if match is None:
            if port is not None and port_values:
                continue  # -v prints GID table rows ("GID[  0]: fe80::...") under the port
            raise ParseError("not an 'ibv_devinfo' line", line=lineno, text=raw)
        (port_values if port is not None else values)[match[1]] = match[2]
    close_hca()
    if not hcas:
        raise ParseError("no 'hca_id:' section found")
    return IbvDevinfo(hcas=tuple(hcas), warnings=tuple(warnings))
