"""``nvidia-smi nvlink -s`` (``--status``): per-GPU NVLink links and their speeds.

A link prints ``Link N: 26.562 GB/s`` when up and ``Link N: <inactive>`` when down; a GPU whose
links are all down prints the NVML error line instead of links. Both are recorded, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import (
    ParseError,
    refuse_other_tool,
    require_text,
    split_lines,
    to_float,
)

_GPU = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*([^)]*)\)\s*$")
_LINK = re.compile(r"^Link\s+(\d+):\s+(.*?)\s*$")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?)\s*GB/s$")
_ELISIONS = ("...", "....", "[...]")


@dataclass(frozen=True, slots=True)
class NvlinkLink:
    """One link of one GPU."""

    link: int
    active: bool
    speed_gbytes_per_s: float | None
    """Per-direction speed in GB/s as nvidia-smi prints it; None when inactive."""


@dataclass(frozen=True, slots=True)
class NvlinkGpu:
    """One GPU and its links."""

    index: int
    name: str
    uuid: str
    links: tuple[NvlinkLink, ...]
    error: str | None
    """The NVML message printed instead of links (for example all links inactive)."""

    @property
    def active_links(self) -> int:
        """Number of links that are up."""
        return sum(1 for link in self.links if link.active)


@dataclass(frozen=True, slots=True)
class NvlinkStatus:
    """All GPUs of ``nvidia-smi nvlink -s``."""

    gpus: tuple[NvlinkGpu, ...]
    warnings: tuple[str, ...]


def parse(text: str) -> NvlinkStatus:
    """Parse ``nvidia-smi nvlink -s``; raise ParseError for lines it does not know."""
    require_text(text, "nvidia-smi nvlink -s")
    refuse_other_tool(text, "nvidia-smi nvlink")
    gpus: list[NvlinkGpu] = []
    current: dict[str, object] | None = None
    links: list[NvlinkLink] = []
    errors: list[str] = []
    warnings: list[str] = []

    def close() -> None:
        if current is not None:
            gpus.append(
                NvlinkGpu(
                    index=int(str(current["index"])),
                    name=str(current["name"]),
                    uuid=str(current["uuid"]),
                    links=tuple(links),
                    error="; ".join(errors) or None,
                )
            )

    for lineno, raw in enumerate(split_lines(text), start=1):
        line = raw.strip()
        if not line:
            continue
        if line in _ELISIONS:
            warnings.append(f"line {lineno}: elision {line!r}: lines are missing here")
            continue
        if line.startswith(("nvidia-smi ", "$ nvidia-smi")):
            continue  # the command line, pasted with the output
        if match := _GPU.match(line):
            close()
            current = {"index": match[1], "name": match[2], "uuid": match[3]}
            links, errors = [], []
            continue
        if current is None:
            raise ParseError("expected a 'GPU N: <name> (UUID: ...)' line", line=lineno, text=raw)
        if match := _LINK.match(line):
            value = match[2]
            if value.strip("<>").lower() == "inactive":
                links.append(NvlinkLink(link=int(match[1]), active=False, speed_gbytes_per_s=None))
                continue
            speed = _SPEED.match(value)
            if speed is None:
                raise ParseError(
                    "link speed is neither 'N GB/s' nor <inactive>", line=lineno, text=raw
                )
            links.append(
                NvlinkLink(
                    link=int(match[1]),
                    active=True,
                    speed_gbytes_per_s=to_float(speed[1], line=lineno, text=raw, what="speed"),
                )
            )
            continue
        if line.startswith(("NVML:", "Unable", "Failed")):
            errors.append(line)
            continue
        raise ParseError("not an 'nvidia-smi nvlink -s' line", line=lineno, text=raw)
    close()
    if not gpus:
        raise ParseError("no 'GPU N: ...' line found")
    last, most = gpus[-1], max(len(g.links) for g in gpus)
    if last.error is None and len(last.links) < most:
        warnings.append(
            f"GPU {last.index} lists {len(last.links)} links, others {most}: the output is cut"
        )
    return NvlinkStatus(gpus=tuple(gpus), warnings=tuple(warnings))
