"""``perfquery`` (infiniband-diags): a port's PortCounters, e.g. ``LinkDownedCounter``.

The tool prints ``# Port counters: Lid 1 port 1 (CapMask: 0x1600)`` and one
``Name:.....value`` line per counter (rdma-core ``infiniband-diags/perfquery.c``, fields dumped by
libibmad's ``mad_dump_perfcounters``). In the basic PortCounters ``LinkDownedCounter`` is 8 bits
wide and stops at 255; ``-x`` (extended counters) prints the same names with 64-bit values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuforge.validate.parsers._common import ParseError, require_text, split_lines, to_int

_HEADER = re.compile(
    r"^# Port (?:extended )?counters: (?P<who>.*?) port (?P<port>\d+) \(CapMask: (?P<cap>[^)]*)\)"
)
_FIELD = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):\.*(?P<value>\S+)\s*$")


@dataclass(frozen=True, slots=True)
class PortCounters:
    """One port's counters as perfquery printed them."""

    port: int
    """The port the counters are for (``PortSelect``; 255 for counters summed over all ports)."""
    target: str
    """What was queried, as perfquery names it (``Lid 1``)."""
    counters: dict[str, int] = field(default_factory=dict)
    """``{"LinkDownedCounter": 0, "SymbolErrorCounter": 0, ...}``; hex values converted."""

    @property
    def link_downed(self) -> int | None:
        """How often the link went down (error recovery failed) since the counters were reset."""
        return self.counters.get("LinkDownedCounter")


def parse(text: str) -> PortCounters:
    """Parse one port's ``perfquery`` output (basic or ``-x`` extended counters)."""
    require_text(text, "perfquery")
    lines = split_lines(text)
    header: re.Match[str] | None = None
    counters: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _HEADER.match(line)
            if match is None:
                continue
            if header is not None:
                raise ParseError(
                    "more than one port in one perfquery output", line=number, text=line
                )
            header = match
            continue
        got = _FIELD.match(line)
        if got is None:
            if header is None:
                continue  # ibwarn/ibpanic chatter before the counters
            raise ParseError("not a perfquery 'Name:....value' line", line=number, text=line)
        counters[got["name"]] = to_int(got["value"], line=number, text=line, what=got["name"])
    if header is None:
        raise ParseError("no '# Port counters: ... port N' header: not perfquery output")
    if not counters:
        raise ParseError("perfquery printed a header but no counter")
    port = counters.get("PortSelect", int(header["port"]))
    return PortCounters(port=port, target=header["who"], counters=counters)
