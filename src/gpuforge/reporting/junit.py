"""The one JUnit XML writer: ``<testsuites>`` of ``<testsuite>`` of ``<testcase>``.

A :class:`Case` passes, fails (``failure``: the check failed), errs (``error``: it could not
conclude) or is skipped; the counts of each suite and of the whole file are computed here, so a
CI reading the file sees the failures whatever wrote them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

#: The outcomes of a case, as JUnit's element names (``pass`` has none).
OUTCOMES = ("pass", "failure", "error", "skipped")


@dataclass(frozen=True)
class Case:
    """One test case."""

    classname: str
    name: str
    outcome: str = "pass"  # one of OUTCOMES
    message: str = ""
    kind: str = ""  # the failure's or error's ``type`` attribute
    text: str = ""  # the failure's or error's body; a passing case's system-out
    time_s: float | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: {self.outcome!r} is not one of {', '.join(OUTCOMES)}")


@dataclass(frozen=True)
class Suite:
    """One test suite (a node, the fabric, a run)."""

    name: str
    cases: Sequence[Case]


def to_junit(name: str, suites: Sequence[Suite]) -> str:
    """The JUnit XML document of ``suites`` (UTF-8 declaration, indented)."""
    root = ET.Element("testsuites", name=name)
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for s in suites:
        suite = ET.SubElement(root, "testsuite", name=s.name)
        counts = dict.fromkeys(totals, 0)
        timed = [c.time_s for c in s.cases if c.time_s is not None]
        for c in s.cases:
            case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name)
            if c.time_s is not None:
                case.set("time", f"{c.time_s:.3f}")
            counts["tests"] += 1
            if c.outcome == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=c.message)
            elif c.outcome in ("failure", "error"):
                counts["failures" if c.outcome == "failure" else "errors"] += 1
                el = ET.SubElement(case, c.outcome, message=c.message)
                if c.kind:
                    el.set("type", c.kind)
                el.text = c.text
            elif c.text:
                ET.SubElement(case, "system-out").text = c.text
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        if timed:
            suite.set("time", f"{sum(timed):.3f}")
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
