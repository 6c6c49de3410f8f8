"""Prometheus textfile-collector files: the one way gpuforge renders and writes its metrics.

node_exporter's textfile collector reads ``*.prom`` files in the text exposition format: per
metric family a ``# HELP`` and a ``# TYPE`` line, then one line per sample, ``name{labels}
value``. :func:`render` writes that format from :class:`Family` values (label values escaped:
backslash, double quote, newline; HELP text: backslash, newline), :func:`write` replaces a file
with it atomically (:mod:`gpuforge.atomic`: node_exporter never reads half a file).

Values are exact: an integer (or a float with an integral value, below 2**53) is written as an
integer, any other float in Python's shortest round-trip form, infinities and NaN as ``+Inf``,
``-Inf``, ``NaN``. Round a timestamp to whole seconds before giving it when whole seconds are
what the series documents.

Standard library only: this module ships in the node checker's zipapp (:mod:`gpuforge.node.bundle`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuforge.atomic import write_atomic

__all__ = [
    "KINDS",
    "Family",
    "Sample",
    "escape_label",
    "labels_text",
    "render",
    "value_text",
    "write",
]

#: The metric types a family may declare.
KINDS = ("gauge", "counter", "untyped")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

#: One sample: its labels (written in this order) and its value.
Sample = tuple[Mapping[str, str], float]


@dataclass(frozen=True)
class Family:
    """A metric family: name, help text, type and samples (none: HELP and TYPE only)."""

    name: str
    help_text: str
    kind: str = "gauge"
    samples: Sequence[Sample] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric name {self.name!r} is not a Prometheus metric name")
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: type {self.kind!r} is not one of {KINDS}")
        for labels, _ in self.samples:
            bad = [k for k in labels if not _LABEL.match(k) or k.startswith("__")]
            if bad:
                raise ValueError(f"metric {self.name}: label name {bad[0]!r} is not valid")

    @classmethod
    def single(cls, name: str, help_text: str, value: float, kind: str = "gauge") -> Family:
        """A family of one sample without labels."""
        return cls(name, help_text, kind, (({}, value),))

    def lines(self) -> list[str]:
        """The family's lines in the text exposition format."""
        help_text = self.help_text.replace("\\", "\\\\").replace("\n", "\\n")
        out = [f"# HELP {self.name} {help_text}", f"# TYPE {self.name} {self.kind}"]
        out += [f"{self.name}{labels_text(lab)} {value_text(v)}" for lab, v in self.samples]
        return out


def escape_label(value: str) -> str:
    """A label value escaped for the exposition format (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels_text(labels: Mapping[str, str]) -> str:
    """``{k="v",...}`` in the mapping's order; empty for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items()) + "}"


def value_text(value: float) -> str:
    """A sample value, exactly (see the module's docstring)."""
    if isinstance(value, int):  # bool too: True is 1
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The families as one textfile (each line ends with a newline; no families: empty)."""
    lines = [line for family in families for line in family.lines()]
    return "".join(f"{line}\n" for line in lines)


def write(path: Path, content: Iterable[Family] | str, *, mode: int | None = 0o644) -> Path:
    """Replace ``path`` with the families (or text :func:`render` made) atomically; ``path``.

    ``mode`` 0644: node_exporter runs as another user than the writer.
    """
    text = content if isinstance(content, str) else render(content)
    return write_atomic(Path(path), text, mode=mode)
