"""``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

With a header the columns are named by it (``memory.total [MiB]`` → name ``memory.total``, unit
``MiB``). Without one the caller passes the ``--query-gpu`` field list. Values that nvidia-smi
cannot give (``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Requested functionality has been
deprecated]``, ...) become None; ``unavailable`` keeps nvidia-smi's reason for each.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuforge.validate.parsers._common import ParseError, require_text, split_lines

_HEADER_FIELD = re.compile(r"^([a-z][A-Za-z0-9_.]*)(?:\s*\[([^\]]+)\])?$")
_UNAVAILABLE = re.compile(r"^\[.*\]$|^N/A$")
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\s*\S+)?$")


@dataclass(frozen=True, slots=True)
class CsvColumn:
    """One ``--query-gpu`` field."""

    name: str
    unit: str | None


@dataclass(frozen=True, slots=True)
class CsvRow:
    """One GPU's values; ``values[name]`` is None where nvidia-smi could not report it."""

    line: int
    values: dict[str, str | None]
    unavailable: dict[str, str]

    def value(self, name: str) -> str | None:
        """The value of ``name``; KeyError when the field was not queried."""
        return self.values[name]

    def number(self, name: str) -> float | None:
        """The numeric value of ``name`` without its unit (``"81559 MiB"`` → 81559.0)."""
        raw = self.values[name]
        if raw is None:
            return None
        match = _NUMBER.match(raw)
        return float(match[1]) if match else None


@dataclass(frozen=True, slots=True)
class NvidiaSmiCsv:
    """The parsed CSV: the columns and one row per GPU."""

    columns: tuple[CsvColumn, ...]
    rows: tuple[CsvRow, ...]
    had_header: bool
    warnings: tuple[str, ...]


def _header(cells: list[str]) -> tuple[CsvColumn, ...] | None:
    columns = []
    for cell in cells:
        match = _HEADER_FIELD.match(cell.strip())
        if match is None:
            return None
        columns.append(CsvColumn(name=match[1], unit=match[2]))
    return tuple(columns)


def parse(text: str, fields: Sequence[str] | None = None) -> NvidiaSmiCsv:
    """Parse the CSV; ``fields`` names the columns of ``noheader`` output."""
    require_text(text, "nvidia-smi --query-gpu CSV")
    numbered = [(n, line) for n, line in enumerate(split_lines(text), start=1) if line.strip()]
    records = [(n, next(csv.reader([line], skipinitialspace=True))) for n, line in numbered]
    first_line, first_cells = records[0]
    columns = _header(first_cells)
    had_header = columns is not None
    if columns is not None:
        body = records[1:]
        if fields is not None and [c.name for c in columns] != [f.strip() for f in fields]:
            raise ParseError("header does not match the fields given", line=first_line)
    elif fields is not None:
        columns = tuple(CsvColumn(name=f.strip(), unit=None) for f in fields)
        body = records
    else:
        raise ParseError(
            "no header row (noheader output): pass the --query-gpu field list",
            line=first_line,
            text=numbered[0][1],
        )
    if not body:
        raise ParseError("header found but no GPU rows", line=first_line)
    rows = []
    for lineno, cells in body:
        if len(cells) != len(columns):
            raise ParseError(
                f"{len(cells)} values for {len(columns)} columns",
                line=lineno,
                text=",".join(cells),
            )
        values: dict[str, str | None] = {}
        unavailable: dict[str, str] = {}
        for column, raw_cell in zip(columns, cells, strict=True):
            cell = raw_cell.strip()
            if not cell or _UNAVAILABLE.match(cell):
                values[column.name] = None
                unavailable[column.name] = cell or "(empty)"
            else:
                values[column.name] = cell
        rows.append(CsvRow(line=lineno, values=values, unavailable=unavailable))
    return NvidiaSmiCsv(columns=columns, rows=tuple(rows), had_header=had_header, warnings=())
