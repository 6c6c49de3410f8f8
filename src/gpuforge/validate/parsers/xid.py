"""Kernel-log ``NVRM: Xid`` and NVSwitch ``SXid`` lines, plus "fallen off the bus" reports.

Reads ``dmesg`` (``[ 1843.308145]``), ``dmesg --time-format iso`` (``kern  :warn  : 2025-...``),
syslog / journal (``Aug 17 06:18:01 host kernel:``) and quoted copies (``> `` prefixes). Each Xid
is labelled from the Xid catalogue (:mod:`gpuforge.validate.xid_catalogue`, the data file
``validate/data/xid_catalogue.yaml`` with NVIDIA's documentation as the source per code): its name,
category and action (``none``, ``monitor``, ``reset_gpu``, ``reboot``, ``inspect``, ``rma``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuforge.validate.parsers._common import ParseError, require_text, split_lines
from gpuforge.validate.xid_catalogue import XidEntry, lookup

_PREFIXES = (
    re.compile(r"^>\s?"),  # quoted (Markdown blockquote)
    re.compile(r"^\w+\s*:\s*\w+\s*:\s*(?P<ts>\d{4}-\d\d-\d\dT[\d:.,]+(?:[+-]\d\d:?\d\d|Z)?)\s+"),
    re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT[\d:.,]+(?:[+-]\d\d:?\d\d|Z)?)\s+\S+\s+kernel:\s*"),
    # plain `dmesg --time-format iso` (no -x): "2025-08-17T06:18:01,123456+00:00 NVRM: ..."
    re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT[\d:.,]+(?:[+-]\d\d:?\d\d|Z))\s+"),
    re.compile(r"^(?P<ts>[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d)\s+\S+\s+kernel:\s*"),
    re.compile(r"^kernel:\s*"),
    re.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s*"),
)
_KERNEL_LIKE = re.compile(
    r"NVRM:|nvidia-nvswitch\d|kernel:|^\[\s*\d+\.\d+\]|^\w+\s*:\s*\w+\s*:\s*\d{4}-"
    r"|^[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d\s"
)
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<rest>.*)$")
_SXID = re.compile(
    r"(?P<dev>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<sxid>\d+),\s*"
    r"(?P<rest>.*)$"
)
_PID = re.compile(r"^pid=(?P<pid>'[^']*'|\S+?),\s*")
_NAME = re.compile(r"^name=(?P<name>\S+?),\s*")
_FALLEN = re.compile(
    r"GPU (?:at PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}[.\d]*)"
)
_DRIVER = re.compile(
    r"NVRM: loading NVIDIA .*?Kernel Module(?: for \S+)?\s+(?P<version>\d+\.\d+(?:\.\d+)?)"
)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One ``NVRM: Xid`` line."""

    line: int
    timestamp: str | None
    pci: str
    xid: int
    pid: str | None
    process: str | None
    message: str
    name: str
    category: str
    action: str


@dataclass(frozen=True, slots=True)
class SxidEvent:
    """One NVSwitch ``SXid`` line."""

    line: int
    timestamp: str | None
    switch: str
    pci: str
    sxid: int
    fatal: bool | None
    """True for ``Fatal``, False for ``Non-fatal``, None when the line does not say."""
    message: str


@dataclass(frozen=True, slots=True)
class BusDrop:
    """A "fallen off the bus" report, with or without an Xid 79 line."""

    line: int
    timestamp: str | None
    pci: str | None


@dataclass(frozen=True, slots=True)
class XidReport:
    """Everything GPU-related found in a kernel log."""

    lines_scanned: int
    xids: tuple[XidEvent, ...]
    sxids: tuple[SxidEvent, ...]
    bus_drops: tuple[BusDrop, ...]
    driver_version: str | None
    warnings: tuple[str, ...]

    @property
    def xid_counts(self) -> dict[int, int]:
        """Xid number → occurrences."""
        counts: dict[int, int] = {}
        for event in self.xids:
            counts[event.xid] = counts.get(event.xid, 0) + 1
        return counts


def classify(xid: int) -> XidEntry:
    """The catalogue entry of an Xid (the catalogue's ``UNKNOWN`` entry when it is not listed)."""
    return lookup(xid)


def _strip(line: str) -> tuple[str, str | None]:
    timestamp = None
    for prefix in _PREFIXES:
        match = prefix.match(line)
        if match:
            if "ts" in prefix.groupindex and match["ts"]:
                timestamp = match["ts"]
            line = line[match.end() :]
    return line, timestamp


def read(text: str) -> XidReport | None:
    """:func:`parse`, None for an empty text or one without a kernel-log line (nothing to judge)."""
    try:
        return parse(text)
    except ParseError:
        return None


def with_lines(text: str, report: XidReport | None) -> list[tuple[XidEvent, str]]:
    """Each Xid of ``report`` (read from ``text``) with its line, stripped: what a check quotes
    and what the node keeps until a reboot."""
    if report is None:
        return []
    lines = split_lines(text)
    return [(e, lines[e.line - 1].strip()) for e in report.xids]


def parse(text: str) -> XidReport:  # noqa: PLR0912 - one branch per kind of line the tool prints
    """Scan a kernel log; raise ParseError when the text is not a kernel log at all."""
    require_text(text, "kernel log (dmesg, journal or syslog)")
    lines = split_lines(text)
    xids: list[XidEvent] = []
    sxids: list[SxidEvent] = []
    drops: list[BusDrop] = []
    driver: str | None = None
    kernel_like = 0
    pending_gpu: tuple[int, str | None, str | None] | None = None
    for lineno, raw in enumerate(lines, start=1):
        line, timestamp = _strip(raw.strip())
        if not line:
            continue
        if _KERNEL_LIKE.search(raw.strip().lstrip("> ")):
            kernel_like += 1
        if match := _XID.search(line):
            rest = match["rest"]
            pid = process = None
            if pid_match := _PID.match(rest):
                pid = pid_match["pid"].strip("'")
                rest = rest[pid_match.end() :]
            if name_match := _NAME.match(rest):
                process = name_match["name"]
                rest = rest[name_match.end() :]
            number = int(match["xid"])
            kind = classify(number)
            xids.append(
                XidEvent(
                    line=lineno,
                    timestamp=timestamp,
                    pci=match["pci"],
                    xid=number,
                    pid=None if pid in (None, "<unknown>") else pid,
                    process=None if process in (None, "<unknown>") else process,
                    message=rest.strip(),
                    name=kind.name,
                    category=kind.category,
                    action=kind.action.value,
                )
            )
            continue
        if match := _SXID.search(line):
            rest = match["rest"].strip()
            fatal = (
                True
                if rest.startswith("Fatal")
                else False
                if rest.startswith("Non-fatal")
                else None
            )
            sxids.append(
                SxidEvent(
                    line=lineno,
                    timestamp=timestamp,
                    switch=match["dev"],
                    pci=match["pci"],
                    sxid=int(match["sxid"]),
                    fatal=fatal,
                    message=rest,
                )
            )
            continue
        if match := _DRIVER.search(line):
            driver = match["version"]
            continue
        if "NVRM: The NVIDIA GPU" in line:
            gpu = _FALLEN.search(line.replace("NVIDIA GPU ", "GPU "))
            pending_gpu = (lineno, timestamp, gpu["pci"] if gpu else None)
        if "fallen off the bus" in line:
            if pending_gpu is not None and "Xid" not in line:
                drops.append(
                    BusDrop(line=pending_gpu[0], timestamp=pending_gpu[1], pci=pending_gpu[2])
                )
            else:
                gpu = _FALLEN.search(line)
                drops.append(
                    BusDrop(line=lineno, timestamp=timestamp, pci=gpu["pci"] if gpu else None)
                )
            pending_gpu = None
    if kernel_like == 0:
        raise ParseError(
            "no kernel-log line (dmesg, journal or syslog) found", line=1, text=lines[0]
        )
    return XidReport(
        lines_scanned=len(lines),
        xids=tuple(xids),
        sxids=tuple(sxids),
        bus_drops=tuple(drops),
        driver_version=driver,
        warnings=(),
    )
