"""perftest bandwidth output (``ib_write_bw``; ``ib_read_bw`` and ``ib_send_bw`` print the same).

The unit comes from the table header: ``BW average[Gb/sec]`` (``--report_gbits``) or
``BW average[MB/sec]``. perftest's MB is 2**20 bytes (its ``format_factor`` is 0x100000) and its
Gb is 10**9 bits; every row also carries the bandwidth converted to Gb/s. Server and client output
may be concatenated or interleaved line by line in one log: identical rows are kept once, and
``sides`` counts the table headers seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import (
    ParseError,
    require_text,
    split_lines,
    to_float,
    to_int,
)

_TITLE = re.compile(r"^\s*(\S.*?\b(?:BW|Bandwidth)\b.*?Test)\s*$")
_TABLE_HEADER = re.compile(
    r"^\s*#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]"
)
_SETTING = re.compile(r"([A-Za-z][^:\t]*?)\s*:\s*(\S+)")
_ERROR = re.compile(r"(Couldn't|Failed|Unable|ERROR|Error|refused|timed out)", re.IGNORECASE)
_MB_PER_SECOND_IN_GBPS = 1048576 * 8 / 1e9
_UNITS_TO_GBPS = {"Gb/sec": 1.0, "MB/sec": _MB_PER_SECOND_IN_GBPS}


@dataclass(frozen=True, slots=True)
class BwRow:
    """One message size."""

    line: int
    size_bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float
    bw_peak_gbps: float
    bw_average_gbps: float


@dataclass(frozen=True, slots=True)
class PerftestBw:
    """A perftest bandwidth run."""

    test: str | None
    device: str | None
    link_type: str | None
    transport: str | None
    connection: str | None
    mtu: str | None
    qps: int | None
    unit: str
    """``Gb/sec`` or ``MB/sec``, as the table header says."""
    rows: tuple[BwRow, ...]
    sides: int
    """Number of result tables seen: 2 when server and client share the log."""
    errors: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def max_bw_average_gbps(self) -> float:
        """The best average bandwidth over all sizes, in Gb/s."""
        return max(row.bw_average_gbps for row in self.rows)


def parse(text: str) -> PerftestBw:  # noqa: PLR0912 - one branch per kind of line the tool prints
    """Parse perftest BW output; raise ParseError when it holds no result row."""
    require_text(text, "ib_write_bw")
    settings: dict[str, str] = {}
    test: str | None = None
    unit: str | None = None
    sides = 0
    rows: list[BwRow] = []
    seen: set[tuple[str, ...]] = set()
    errors: list[str] = []
    warnings: list[str] = []
    for lineno, raw in enumerate(split_lines(text), start=1):
        line = raw.strip()
        if not line or set(line) <= {"-", "*"}:
            continue
        if match := _TABLE_HEADER.match(line):
            peak_unit, avg_unit = match[1], match[2]
            if avg_unit not in _UNITS_TO_GBPS or peak_unit != avg_unit:
                raise ParseError(f"unknown bandwidth unit {avg_unit!r}", line=lineno, text=raw)
            if unit is not None and unit != avg_unit:
                raise ParseError("tables with different units in one log", line=lineno, text=raw)
            unit = avg_unit
            sides += 1
            continue
        tokens = line.split()
        if re.fullmatch(r"\d+", tokens[0]) and len(tokens) == 5:
            if unit is None:
                raise ParseError("result row before the '#bytes' header", line=lineno, text=raw)
            key = tuple(tokens)
            if key in seen:
                continue
            seen.add(key)
            factor = _UNITS_TO_GBPS[unit]
            peak = to_float(tokens[2], line=lineno, text=raw, what="BW peak")
            average = to_float(tokens[3], line=lineno, text=raw, what="BW average")
            rows.append(
                BwRow(
                    line=lineno,
                    size_bytes=to_int(tokens[0], line=lineno, text=raw, what="#bytes"),
                    iterations=to_int(tokens[1], line=lineno, text=raw, what="#iterations"),
                    bw_peak=peak,
                    bw_average=average,
                    msg_rate_mpps=to_float(tokens[4], line=lineno, text=raw, what="MsgRate"),
                    bw_peak_gbps=round(peak * factor, 3),
                    bw_average_gbps=round(average * factor, 3),
                )
            )
            continue
        if match := _TITLE.match(line):
            test = test or match[1]
            continue
        if line.startswith(("local address", "remote address", "GID:", "Waiting for client")):
            continue
        if _ERROR.search(line):
            errors.append(f"line {lineno}: {line}")
            continue
        for key, value in _SETTING.findall(line):
            settings.setdefault(key.strip(), value)
    if not rows:
        detail = f": {errors[0]}" if errors else ""
        raise ParseError(f"no bandwidth result row found{detail}")
    qps = settings.get("Number of qps")
    return PerftestBw(
        test=test,
        device=settings.get("Device"),
        link_type=settings.get("Link type"),
        transport=settings.get("Transport type"),
        connection=settings.get("Connection type"),
        mtu=settings.get("Mtu"),
        qps=int(qps) if qps and qps.isdigit() else None,
        unit=unit or "",
        rows=tuple(rows),
        sides=sides,
        errors=tuple(errors),
        warnings=tuple(warnings),
    )
