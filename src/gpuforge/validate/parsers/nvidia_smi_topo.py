"""``nvidia-smi topo -m``: the GPU/NIC connection matrix, CPU and NUMA affinity, legends.

Reads the raw output (ANSI underline around the header row, TAB-separated cells) and copies
whose whitespace was re-aligned with spaces. Cells must be one of the documented link kinds
(``X``, ``SYS``, ``NODE``, ``PHB``, ``PXB``, ``PIX``, ``NV#``); anything else is a ParseError.
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

_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx5_\d+|CPU\d+)$")
_CELL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|PXN|C2C|NV\d+|N/A)$")
#: Every driver prints these in its 'Legend', in this order (NV# last).
_LEGEND_KEYS = ("X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#")
_LEGEND_ENTRY = re.compile(r"^\s*(\S+)\s*[=:]\s*(.+?)\s*$")


@dataclass(frozen=True, slots=True)
class TopoGpu:
    """A GPU row's affinity columns."""

    name: str
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: str | None


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """The parsed ``topo -m`` output."""

    devices: tuple[str, ...]
    gpus: tuple[TopoGpu, ...]
    nics: tuple[str, ...]
    matrix: dict[str, dict[str, str]]
    """``matrix["GPU0"]["NIC1"]`` → ``"PIX"``."""
    nic_names: dict[str, str]
    """``NIC0`` → ``mlx5_0`` from the ``NIC Legend``; empty when the legend is absent."""
    legend: dict[str, str]
    warnings: tuple[str, ...]

    def link(self, a: str, b: str) -> str:
        """The connection kind between two devices."""
        return self.matrix[a][b]

    def nvlink_count(self, a: str, b: str) -> int:
        """Number of bonded NVLinks between two GPUs (0 when not connected by NVLink)."""
        cell = self.matrix[a][b]
        return int(cell[2:]) if cell.startswith("NV") else 0


def parse(text: str) -> TopoMatrix:  # noqa: PLR0912, PLR0915 - one branch per kind of line the tool prints
    """Parse ``nvidia-smi topo -m``; raise ParseError when there is no matrix."""
    require_text(text, "nvidia-smi topo -m")
    refuse_other_tool(text, "nvidia-smi topo -m")
    lines = split_lines(text)
    header_index = None
    for index, line in enumerate(lines):
        cells = [c for c in re.split(r"\t|\s{2,}", line.strip()) if c]
        if cells and _DEVICE.match(cells[0]) and cells[0].startswith("GPU"):
            header_index = index
            break
    if header_index is None:
        raise ParseError("no header row listing GPU0 ... found")
    header = [c.strip() for c in re.split(r"\t|\s{2,}", lines[header_index].strip()) if c.strip()]
    devices = tuple(c for c in header if _DEVICE.match(c))
    info_columns = header[len(devices) :]
    if list(header[: len(devices)]) != list(devices):
        raise ParseError("device columns are not first in the header", line=header_index + 1)
    matrix: dict[str, dict[str, str]] = {}
    gpus: list[TopoGpu] = []
    warnings: list[str] = []
    index = header_index + 1
    while index < len(lines) and lines[index].strip():
        lineno = index + 1
        line = lines[index]
        tokens = line.split()
        label = tokens[0]
        if label not in devices:
            raise ParseError(f"row {label!r} is not a device of the header", line=lineno, text=line)
        cells = tokens[1 : 1 + len(devices)]
        if len(cells) < len(devices):
            raise ParseError("row has fewer cells than devices", line=lineno, text=line)
        for cell in cells:
            if not _CELL.match(cell):
                raise ParseError(f"unknown connection kind {cell!r}", line=lineno, text=line)
        matrix[label] = dict(zip(devices, cells, strict=True))
        info = tokens[1 + len(devices) :]
        if label.startswith("GPU"):
            values: dict[str, str | None] = {
                name: (info[i] if i < len(info) and info[i] != "N/A" else None)
                for i, name in enumerate(info_columns)
            }
            gpus.append(
                TopoGpu(
                    name=label,
                    cpu_affinity=values.get("CPU Affinity"),
                    numa_affinity=values.get("NUMA Affinity"),
                    gpu_numa_id=values.get("GPU NUMA ID"),
                )
            )
        index += 1
    missing = [d for d in devices if d not in matrix]
    if missing:
        raise ParseError(f"no matrix row for {', '.join(missing)}", line=index)
    legend: dict[str, str] = {}
    nic_names: dict[str, str] = {}
    section = None
    for rest in lines[index:]:
        stripped = rest.strip()
        if stripped.rstrip(":") in ("Legend", "NIC Legend"):
            section = stripped.rstrip(":")
            continue
        match = _LEGEND_ENTRY.match(rest)
        if section and match:
            (legend if section == "Legend" else nic_names)[match[1]] = match[2]
    nics = tuple(d for d in devices if d.startswith("NIC"))
    if not legend:
        warnings.append("no 'Legend' section")
    elif cut := [key for key in _LEGEND_KEYS if key not in legend]:
        warnings.append(f"the 'Legend' lacks {', '.join(cut)}: the output is cut")
    if nics and nic_names and len(nic_names) < len(nics):
        warnings.append(
            f"the 'NIC Legend' names {len(nic_names)} of {len(nics)} NICs: the output is cut"
        )
    if nics and not nic_names:
        warnings.append(
            "NIC columns but no 'NIC Legend' section: the NICs' device names (mlx5_N) are unknown"
        )
    return TopoMatrix(
        devices=devices,
        gpus=tuple(gpus),
        nics=nics,
        matrix=matrix,
        nic_names=nic_names,
        legend=legend,
        warnings=tuple(warnings),
    )
