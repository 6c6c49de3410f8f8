"""The compatibility matrix of the GPU software stack: data in ``data/compat.yaml``, checked here.

:func:`load_matrix` reads and validates the file (a bad row is an :class:`InputError` naming the
file and the key); :func:`judge` checks a set of pins (component -> version) against every rule
and returns the incompatible pairs (:class:`Conflict`, a refusal) and the combinations the
matrix does not know (:class:`Unknown`, a warning). Components absent from the pins are not
judged: a spec pins no kernel, a node reports no PMIx, and a rule needs both of its sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuforge.errors import InputError

MATRIX_FILE = Path(__file__).parent / "data" / "compat.yaml"

COMPONENTS = (
    "nvidia_driver",
    "fabricmanager",
    "cuda",
    "nccl",
    "dcgm",
    "doca_ofed",
    "kernel",
    "slurm",
    "pmix",
)
"""Every component a rule may name; the first six but fabricmanager are spec pins."""

Component = Literal[
    "nvidia_driver", "fabricmanager", "cuda", "nccl", "dcgm", "doca_ofed", "kernel", "slurm", "pmix"
]

_COMPARATOR = re.compile(r"^(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)$")
_VERSION = re.compile(r"^\d+(?:\.\d+)*$")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version or a Debian package version.

    ``1:4.2.3-1`` -> (4, 2, 3) (epoch and revision dropped), ``2.26.2-1+cuda12.8`` -> (2, 26, 2),
    ``6.1.0-28-amd64`` -> (6, 1, 0).
    """
    text = version.strip()
    if ":" in text:
        text = text.split(":", 1)[1]
    match = re.match(r"\d+(?:\.\d+)*", text)
    if match is None:
        return ()
    return tuple(int(p) for p in match.group(0).split("."))


def _compare(left: tuple[int, ...], right: tuple[int, ...]) -> int:
    """-1, 0 or 1; missing trailing parts count as 0 (12.8 == 12.8.0)."""
    width = max(len(left), len(right))
    a = left + (0,) * (width - len(left))
    b = right + (0,) * (width - len(right))
    return (a > b) - (a < b)


@dataclass(frozen=True, slots=True)
class VersionRange:
    """Comparators joined by commas, all of which must hold: ``>=12.8.1,<12.9``."""

    text: str
    bounds: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        """Parse ``text``; raise ValueError naming the comparator that is not one."""
        bounds = []
        for part in text.split(","):
            match = _COMPARATOR.match(part.strip())
            if match is None:
                raise ValueError(
                    f"{part.strip()!r} is not a comparator such as '>=12.8' or '<13' "
                    "(ranges are comparators joined by commas)"
                )
            bounds.append((match.group(1), release(match.group(2))))
        return cls(text, tuple(bounds))

    def contains(self, version: str) -> bool:
        """Whether ``version`` (any form :func:`release` reads) satisfies every comparator."""
        got = release(version)
        if not got:
            return False
        for op, bound in self.bounds:
            c = _compare(got, bound)
            ok = {">=": c >= 0, "<=": c <= 0, "==": c == 0, ">": c > 0, "<": c < 0}[op]
            if not ok:
                return False
        return True


def _as_range(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a range: write it as text, e.g. '>=12.8,<12.9'")
    return VersionRange.parse(value)


def _version(value: object) -> object:
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a version: write digits and dots as text, e.g. '570.26'"
        )
    return value


def _url(value: object) -> object:
    if not isinstance(value, str) or not re.fullmatch(r"https://[^\s/]+\S*", value):
        raise ValueError(f"{value!r} is not a public https:// URL")
    return value


Url = Annotated[str, Field(description="public page that states the row")]


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class Row(_Data):
    """One row: the subject versions it covers and what it demands of the other component."""

    range: VersionRange
    min: str | None = None
    allow: tuple[str, ...] | None = None
    source: Url

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, value: object) -> object:
        return _as_range(value)

    @field_validator("min", mode="before")
    @classmethod
    def _min(cls, value: object) -> object:
        return value if value is None else _version(value)

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: object) -> object:
        return _url(value)

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: object) -> object:
        if value is None:
            return value
        if not isinstance(value, list) or not value:
            raise ValueError("must be a non-empty list of versions")
        return tuple(_version(v) for v in value)


class Rule(_Data):
    """One rule of the matrix (``kind`` says how its rows are read, docs/upgrades.md)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{1,60}$")
    kind: Literal["minimum", "allowed", "equal"]
    subject: Component
    other: Component
    parts: int = Field(default=1, ge=1, le=4)
    why: str = Field(min_length=10)
    source: Url | None = None
    rows: tuple[Row, ...] = ()

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: object) -> object:
        return value if value is None else _url(value)

    @model_validator(mode="after")
    def _rows_fit_kind(self) -> Rule:
        if self.subject == self.other:
            raise ValueError("subject and other must differ")
        if self.kind == "equal":
            if self.rows or self.source is None:
                raise ValueError("an equal rule has a source and no rows")
            return self
        if not self.rows:
            raise ValueError(f"a {self.kind} rule needs rows")
        field = "min" if self.kind == "minimum" else "allow"
        for i, row in enumerate(self.rows):
            if getattr(row, field) is None:
                raise ValueError(f"rows[{i}].{field}: field required for a {self.kind} rule")
            wrong = "allow" if field == "min" else "min"
            if getattr(row, wrong) is not None:
                raise ValueError(f"rows[{i}].{wrong}: not a field of a {self.kind} rule")
        return self


class Matrix(_Data):
    """The whole file."""

    version: Literal[1]
    rules: tuple[Rule, ...] = Field(min_length=1)

    @field_validator("rules")
    @classmethod
    def _unique(cls, value: tuple[Rule, ...]) -> tuple[Rule, ...]:
        names = [r.name for r in value]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate rule name {', '.join(dup)}")
        return value


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """``rules[2].rows[3].min`` (rule indexes shown with the rule's name when it has one)."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str) and out.count("[") == 1:
                out += f"({node['name']})"
        else:
            if "function-" in part or "[" in part:
                continue
            out += f".{part}" if out else part
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def load_matrix(path: Path = MATRIX_FILE) -> Matrix:
    """Read and validate the matrix at ``path``; an error names the file and the key."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the compatibility matrix: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise InputError(f"{path}{where}: not valid YAML: {reason}") from None
    try:
        return Matrix.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "field required"
        elif err["type"] == "extra_forbidden":
            message = "unknown field"
        raise InputError(f"{path}: {_where(tuple(err['loc']), data)}: {message}") from None


@cache
def matrix() -> Matrix:
    """The shipped matrix (read once)."""
    return load_matrix()


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two pinned versions a rule forbids together."""

    rule: str
    subject: str
    subject_version: str
    other: str
    other_version: str
    demand: str  # what the rule demands of ``other``, e.g. ">= 570.124.06"
    source: str

    def message(self) -> str:
        """One line naming both versions and the rule."""
        return (
            f"{self.other} {self.other_version} does not work with {self.subject} "
            f"{self.subject_version}: rule {self.rule} demands {self.other} {self.demand} "
            f"({self.source})"
        )


@dataclass(frozen=True, slots=True)
class Unknown:
    """A pinned version no row of a rule covers: the matrix cannot judge the pair."""

    rule: str
    subject: str
    subject_version: str
    other: str
    other_version: str

    def message(self) -> str:
        """One line naming the combination the matrix does not know."""
        return (
            f"the compatibility matrix does not know {self.subject} {self.subject_version} "
            f"(rule {self.rule}, with {self.other} {self.other_version}): check it by hand "
            "and add a row to src/gpuforge/topology/data/compat.yaml"
        )


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the matrix says of one set of pins."""

    conflicts: tuple[Conflict, ...]
    unknown: tuple[Unknown, ...]

    @property
    def ok(self) -> bool:
        """No conflict (unknown combinations are warnings)."""
        return not self.conflicts


def judge(pins: dict[str, str], rules: Matrix | None = None) -> Judgement:
    """Check ``pins`` (component -> version) against every rule of the matrix."""
    conflicts: list[Conflict] = []
    unknown: list[Unknown] = []
    for rule in (rules or matrix()).rules:
        subject = pins.get(rule.subject)
        other = pins.get(rule.other)
        if not subject or not other:
            continue
        if rule.kind == "equal":
            if _compare(release(subject), release(other)) != 0:
                conflicts.append(
                    Conflict(
                        rule.name,
                        rule.subject,
                        subject,
                        rule.other,
                        other,
                        f"== {subject}",
                        rule.source or "",
                    )
                )
            continue
        row = next((r for r in rule.rows if r.range.contains(subject)), None)
        if row is None:
            unknown.append(Unknown(rule.name, rule.subject, subject, rule.other, other))
            continue
        if rule.kind == "minimum":
            assert row.min is not None  # noqa: S101 - the model guarantees it
            if _compare(release(other), release(row.min)) < 0:
                conflicts.append(
                    Conflict(
                        rule.name,
                        rule.subject,
                        subject,
                        rule.other,
                        other,
                        f">= {row.min}",
                        row.source,
                    )
                )
        else:
            assert row.allow is not None  # noqa: S101 - the model guarantees it
            head = release(other)[: rule.parts]
            if not any(_compare(head, release(a)) == 0 for a in row.allow):
                conflicts.append(
                    Conflict(
                        rule.name,
                        rule.subject,
                        subject,
                        rule.other,
                        other,
                        f"in {', '.join(row.allow)}",
                        row.source,
                    )
                )
    return Judgement(tuple(conflicts), tuple(unknown))


SPEC_FIELDS = ("nvidia_driver", "cuda", "nccl", "dcgm", "slurm", "doca_ofed")
"""The components a spec's ``versions`` pins, under the same names."""


def spec_pins(versions: Any) -> dict[str, str]:
    """A spec's pins as components; Fabric Manager follows the driver (the role's default)."""
    pins = {f: getattr(versions, f) for f in SPEC_FIELDS if getattr(versions, f, None)}
    if "nvidia_driver" in pins:
        pins["fabricmanager"] = pins["nvidia_driver"]
    return pins
