"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf``, ...).

Reads both column layouts: the old one (``redop`` without ``root``, an ``error`` column holding a
float or ``N/A``) and the new one (``root`` and ``#wrong`` columns), with or without the
``0:`` (``srun -l``) and ``[1,0]<stdout>:`` (``mpirun --tag-output``) line prefixes. Lines that
other processes interleave (``NCCL INFO`` and the like) are skipped.
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

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s|$))\s?")
_RANK = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?\s+Pid\s+(?P<pid>\d+)\s+on\s+"
    r"(?P<host>\S+)\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\S*)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_PARAMS = re.compile(r"^#\s*nThread\s")
_VERSION = re.compile(r"NCCL version\s+(\S+)")
_MEASURE_COLUMNS = 4  # time, algbw, busbw, #wrong (or error), once out of place and once in place


@dataclass(frozen=True, slots=True)
class NcclRank:
    """One ``#  Rank ...`` line: which GPU on which host a rank ran on."""

    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    bus_id: str
    gpu_name: str


@dataclass(frozen=True, slots=True)
class NcclMeasure:
    """One half of a row (out-of-place or in-place)."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    """``#wrong`` (new layout): elements that failed validation; None when not validated."""
    error: float | None
    """``error`` (old layout): largest deviation; None when ``N/A``."""


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One message size."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: NcclMeasure
    in_place: NcclMeasure


@dataclass(frozen=True, slots=True)
class NcclTestsResult:
    """A whole nccl-tests run."""

    layout: str
    """``new`` (``root`` and ``#wrong`` columns) or ``old`` (``error`` column)."""
    params: dict[str, str]
    nccl_version: str | None
    ranks: tuple[NcclRank, ...]
    hosts: tuple[str, ...]
    rows: tuple[NcclRow, ...]
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw_gbps: float | None
    wrong_total: int
    """Sum of ``#wrong`` over all rows and both halves; 0 for the old layout."""
    warnings: tuple[str, ...]

    @property
    def gpu_count(self) -> int:
        """Number of ranks listed in the header (0 when the header is missing)."""
        return len(self.ranks)

    @property
    def max_busbw_gbps(self) -> float:
        """Highest out-of-place bus bandwidth of any row."""
        return max(r.out_of_place.busbw_gbps for r in self.rows)


def _parse_params(line: str) -> dict[str, str]:
    body = line.lstrip("#").strip()
    # "nThread 1 nGpus 1 minBytes 8 ... step: 2(factor) warmup iters: 5 iters: 20 validation: 1"
    pairs = re.findall(r"([A-Za-z][A-Za-z ]*?):?\s+(-?[0-9][^\s]*)", body)
    return {key.strip(): value for key, value in pairs}


def _measure(tokens: list[str], *, lineno: int, text: str, layout: str) -> NcclMeasure:
    time_s, alg_s, bus_s, check_s = tokens
    wrong: int | None = None
    error: float | None = None
    if check_s != "N/A":
        if layout == "new":
            wrong = to_int(check_s, line=lineno, text=text, what="#wrong")
        else:
            error = to_float(check_s, line=lineno, text=text, what="error")
    return NcclMeasure(
        time_us=to_float(time_s, line=lineno, text=text, what="time"),
        algbw_gbps=to_float(alg_s, line=lineno, text=text, what="algbw"),
        busbw_gbps=to_float(bus_s, line=lineno, text=text, what="busbw"),
        wrong=wrong,
        error=error,
    )


def _row(tokens: list[str], *, lineno: int, text: str, layout: str) -> NcclRow:
    if len(tokens) < 3 + 2 * _MEASURE_COLUMNS:
        raise ParseError("result row has too few columns", line=lineno, text=text)
    lead = tokens[: -2 * _MEASURE_COLUMNS]
    if len(lead) > 5:
        raise ParseError("result row has too many columns", line=lineno, text=text)
    redop: str | None = None
    root: int | None = None
    for token in lead[3:]:
        if re.fullmatch(r"-?\d+", token):
            root = int(token)
        else:
            redop = token
    tail = tokens[-2 * _MEASURE_COLUMNS :]
    return NcclRow(
        line=lineno,
        size_bytes=to_int(lead[0], line=lineno, text=text, what="size"),
        count=to_int(lead[1], line=lineno, text=text, what="count"),
        dtype=lead[2],
        redop=redop,
        root=root,
        out_of_place=_measure(tail[:_MEASURE_COLUMNS], lineno=lineno, text=text, layout=layout),
        in_place=_measure(tail[_MEASURE_COLUMNS:], lineno=lineno, text=text, layout=layout),
    )


def parse(text: str) -> NcclTestsResult:  # noqa: PLR0912, PLR0915 - one branch per kind of line the tool prints
    """Parse one nccl-tests run; raise ParseError when there is no result table."""
    require_text(text, "nccl-tests")
    params: dict[str, str] = {}
    version: str | None = None
    ranks: list[NcclRank] = []
    rows: list[NcclRow] = []
    layout: str | None = None
    oob: int | None = None
    oob_ok: bool | None = None
    avg: float | None = None
    warnings: list[str] = []
    for lineno, raw in enumerate(split_lines(text), start=1):
        line = _PREFIX.sub("", raw, count=1).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped in ("...", "[...]", "....") or stripped == "# ...":
            warnings.append(f"line {lineno}: elision {stripped!r}: lines are missing here")
            continue
        if _PARAMS.match(stripped):
            params = _parse_params(stripped)
            continue
        if match := _RANK.match(stripped):
            ranks.append(
                NcclRank(
                    rank=int(match["rank"]),
                    group=int(match["group"]) if match["group"] is not None else None,
                    pid=int(match["pid"]),
                    host=match["host"],
                    device=int(match["device"]),
                    bus_id=match["bus"],
                    gpu_name=match["name"],
                )
            )
            continue
        if match := _OOB.match(stripped):
            oob = int(match[1])
            oob_ok = match[2] == "OK" if match[2] else None
            continue
        if match := _AVG.match(stripped):
            avg = to_float(match[1], line=lineno, text=raw, what="average bus bandwidth")
            continue
        if match := _VERSION.search(stripped):
            version = match[1]
            continue
        if stripped.startswith("#"):
            header = stripped.lstrip("#").split()
            if header[:2] == ["size", "count"]:
                if "#wrong" in header:
                    layout = "new"
                elif "error" in header:
                    layout = "old"
                else:
                    raise ParseError("unknown nccl-tests column header", line=lineno, text=raw)
            continue
        tokens = stripped.split()
        if not re.fullmatch(r"\d+", tokens[0]):
            continue  # interleaved NCCL INFO lines, warnings, shell noise
        if layout is None:
            raise ParseError("result row before the column header", line=lineno, text=raw)
        rows.append(_row(tokens, lineno=lineno, text=raw, layout=layout))
    if layout is None:
        raise ParseError("no nccl-tests column header ('#  size  count  type ...') found")
    if not rows:
        raise ParseError("nccl-tests column header found but no result rows")
    if not ranks:
        warnings.append("no '#  Rank ...' lines: the GPUs and hosts that took part are unknown")
    if avg is None:
        warnings.append("no '# Avg bus bandwidth' line: the output is cut or the run did not end")
    if oob is None:
        warnings.append("no '# Out of bounds values' line")
    hosts = tuple(dict.fromkeys(r.host for r in ranks))
    wrong_total = sum((r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) for r in rows)
    return NcclTestsResult(
        layout=layout,
        params=params,
        nccl_version=version,
        ranks=tuple(ranks),
        hosts=hosts,
        rows=tuple(rows),
        out_of_bounds=oob,
        out_of_bounds_ok=oob_ok,
        avg_busbw_gbps=avg,
        wrong_total=wrong_total,
        warnings=tuple(warnings),
    )
