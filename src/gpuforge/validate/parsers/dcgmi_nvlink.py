"""``dcgmi nvlink -s`` (``--link-status``): one letter per NVLink per GPU and per NVSwitch.

Letters, per the tool's own key: ``U`` up, ``D`` down, ``X`` disabled, ``_`` not supported.
(``dcgmi nvlink -e``, the error-count table, is a different output and is refused.)
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

_ENTITY = re.compile(r"^(gpuId|physicalId|switchId|nvSwitchId)\s+(\d+):\s*$", re.IGNORECASE)
_STATES = {"U": "up", "D": "down", "X": "disabled", "_": "not_supported"}


@dataclass(frozen=True, slots=True)
class LinkStates:
    """The links of one GPU or NVSwitch, in link order."""

    kind: str
    """``gpu`` or ``nvswitch``."""
    id: int
    states: tuple[str, ...]
    """``up``, ``down``, ``disabled`` or ``not_supported`` per link."""

    @property
    def up(self) -> int:
        """Number of links that are up."""
        return self.states.count("up")


@dataclass(frozen=True, slots=True)
class DcgmiNvlinkStatus:
    """All entities of ``dcgmi nvlink -s``."""

    gpus: tuple[LinkStates, ...]
    nvswitches: tuple[LinkStates, ...]
    warnings: tuple[str, ...]


def parse(text: str) -> DcgmiNvlinkStatus:
    """Parse ``dcgmi nvlink -s``; raise ParseError for anything else."""
    require_text(text, "dcgmi nvlink -s")
    refuse_other_tool(text, "dcgmi nvlink")
    section: str | None = None
    gpus: list[LinkStates] = []
    switches: list[LinkStates] = []
    entity: tuple[str, int] | None = None
    saw_title = saw_switches = saw_key = False
    for lineno, raw in enumerate(split_lines(text), start=1):
        line = raw.strip()
        if line.startswith("Key:"):
            saw_key = True
            continue
        if not line or re.fullmatch(r"\+[-+]+\+", line):
            continue
        if "NvLink Link Status" in line:
            saw_title = True
            continue
        if "NVLINK Error Counts" in line:
            raise ParseError("this is 'dcgmi nvlink -e' (error counts), not -s", line=lineno)
        if line in ("GPUs:", "NvSwitches:"):
            section = "gpu" if line == "GPUs:" else "nvswitch"
            saw_switches = saw_switches or section == "nvswitch"
            continue
        if line.startswith("No NvSwitches found"):
            continue
        if match := _ENTITY.match(line):
            entity = ("gpu" if section != "nvswitch" else "nvswitch", int(match[2]))
            continue
        letters = line.split()
        if entity is not None and letters and all(ch in _STATES for ch in letters):
            states = LinkStates(
                kind=entity[0], id=entity[1], states=tuple(_STATES[c] for c in letters)
            )
            (gpus if entity[0] == "gpu" else switches).append(states)
            entity = None
            continue
        raise ParseError("not a 'dcgmi nvlink -s' line", line=lineno, text=raw)
    if not saw_title or not (gpus or switches):
        raise ParseError("no 'NvLink Link Status' table with link states found")
    return DcgmiNvlinkStatus(
        gpus=tuple(gpus),
        nvswitches=tuple(switches),
        warnings=tuple(_cut(gpus, entity, saw_switches=saw_switches, saw_key=saw_key)),
    )


def _cut(
    gpus: list[LinkStates], pending: tuple[str, int] | None, *, saw_switches: bool, saw_key: bool
) -> list[str]:
    """Signs that the output was cut: dcgmi always ends with the NvSwitches section and the key."""
    warnings = []
    if pending is not None:
        warnings.append(f"{pending[0]} {pending[1]} has no link states: the output is cut")
    if not saw_switches:
        warnings.append("no 'NvSwitches:' section: the output is cut (GPUs may be missing)")
    elif not saw_key:
        warnings.append("no 'Key:' line at the end: the output is cut")
    counts = [len(g.states) for g in gpus]
    if counts and counts[-1] < max(counts):
        warnings.append(
            f"gpu {gpus[-1].id} lists {counts[-1]} links, others {max(counts)}: the output is cut"
        )
    return warnings
