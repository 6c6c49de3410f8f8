"""``ibstat``: channel adapters (CA), their ports, state, physical state, rate and link layer.

Indentation may be TABs or spaces. An ``ibpanic:`` line (ibstat failing on a device, exit 255)
is kept in ``errors``: the adapters before it are real, the one it names is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    split_lines,
    to_int,
)

_CA = re.compile(r"^CA '([^']+)'\s*$")
_PORT = re.compile(r"^Port (\d+):\s*$")
_KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port of a CA."""

    port: int
    state: str | None
    """``Active``, ``Down``, ``Initializing``, ``Armed``."""
    physical_state: str | None
    """``LinkUp``, ``Disabled``, ``Polling``, ``Sleep``, ..."""
    rate_gbps: float | None
    base_lid: int | None
    lmc: int | None
    sm_lid: int | None
    capability_mask: str | None
    port_guid: str | None
    link_layer: str | None
    """``InfiniBand`` or ``Ethernet``."""


@dataclass(frozen=True, slots=True)
class IbCa:
    """One channel adapter (``mlx5_0``)."""

    name: str
    ca_type: str | None
    number_of_ports: int | None
    firmware_version: str | None
    hardware_version: str | None
    node_guid: str | None
    system_image_guid: str | None
    ports: tuple[IbPort, ...]


@dataclass(frozen=True, slots=True)
class IbstatReport:
    """All CAs ``ibstat`` printed."""

    cas: tuple[IbCa, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]

    def ca(self, name: str) -> IbCa:
        """The CA called ``name``; KeyError when absent."""
        for ca in self.cas:
            if ca.name == name:
                return ca
        raise KeyError(name)


def _port(number: int, values: dict[str, str], lineno: int) -> IbPort:
    def num(key: str) -> int | None:
        return (
            to_int(values[key], line=lineno, text=values[key], what=key) if key in values else None
        )

    rate = values.get("Rate")
    try:
        rate_gbps = float(rate) if rate is not None else None
    except ValueError:
        raise ParseError(f"rate is not a number: {rate!r}", line=lineno) from None
    return IbPort(
        port=number,
        state=values.get("State"),
        physical_state=values.get("Physical state"),
        rate_gbps=rate_gbps,
        base_lid=num("Base lid"),
        lmc=num("LMC"),
        sm_lid=num("SM lid"),
        capability_mask=values.get("Capability mask"),
        port_guid=values.get("Port GUID"),
        link_layer=values.get("Link layer"),
    )


def parse(text: str) -> IbstatReport:
    """Parse ``ibstat`` output; raise ParseError on lines it does not know."""
    refuse_other_tool(text, "ibstat")
    cas: list[IbCa] = []
    errors: list[str] = []
    warnings: list[str] = []
    ca_name: str | None = None
    ca_values: dict[str, str] = {}
    ports: list[IbPort] = []
    port_number: int | None = None
    port_values: dict[str, str] = {}
    port_line = 0

    def close_port() -> None:
        nonlocal port_number
        if port_number is not None:
            ports.append(_port(port_number, port_values, port_line))
            port_number = None

    def close_ca(lineno: int) -> None:
        close_port()
        if ca_name is None:
            return
        declared = ca_values.get("Number of ports")
        count = (
            to_int(declared, line=lineno, text=declared, what="Number of ports")
            if declared
            else None
        )
        if count is not None and count != len(ports):
            warnings.append(
                f"CA {ca_name}: 'Number of ports: {count}' but {len(ports)} port(s) listed"
            )
        cas.append(
            IbCa(
                name=ca_name,
                ca_type=ca_values.get("CA type"),
                number_of_ports=count,
                firmware_version=ca_values.get("Firmware version"),
                hardware_version=ca_values.get("Hardware version"),
                node_guid=ca_values.get("Node GUID"),
                system_image_guid=ca_values.get("System image GUID"),
                ports=tuple(ports),
            )
        )

    lineno = 0
    for lineno, raw in enumerate(split_lines(text), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("ibpanic:") or line.startswith("ibwarn:"):
            errors.append(line)
            continue
        if match := _CA.match(line):
            close_ca(lineno)
            ca_name, ca_values, ports = match[1], {}, []
            continue
        if ca_name is None:
            raise ParseError("expected a \"CA 'mlx5_N'\" line", line=lineno, text=raw)
        if match := _PORT.match(line):
            close_port()
            port_number, port_values, port_line = int(match[1]), {}, lineno
            continue
        match = _KEY_VALUE.match(line)
        if match is None:
            raise ParseError("not an 'ibstat' line", line=lineno, text=raw)
        (port_values if port_number is not None else ca_values)[match[1]] = match[2]
    close_ca(lineno)
    if not cas and not errors:
        raise ParseError("no \"CA '...'\" section found")
    if errors:
        warnings.append("ibstat reported errors: the adapters they name are missing")
    return IbstatReport(cas=tuple(cas), errors=tuple(errors), warnings=tuple(warnings))
