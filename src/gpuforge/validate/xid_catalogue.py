"""The Xid -> action catalogue (``data/xid_catalogue.yaml``), loaded into frozen, typed entries.

The data file is the one source of truth for what an ``NVRM: Xid`` line means and what gpuforge
does about it: the kernel-log parser (:mod:`gpuforge.validate.parsers.xid`) labels events with it,
the ``gpu.xid`` check (:func:`gpuforge.validate.checks.no_hardware_xids`) turns it into a verdict
and a drain action, and later health checks, alerts and predictive maintenance read the same
entries. Every entry names its source (NVIDIA's Xid catalog, gpud); docs/health.md shows the table.

The action vocabulary (:class:`Action`), weakest first:

* ``none``: nothing to do (a follow-on report, an engine the cluster does not use);
* ``monitor``: the job failed or an early sign appeared; the node stays in service (WARN);
* ``reset_gpu``: drain, reset the GPU, re-validate;
* ``reboot``: drain, reboot the node, re-validate;
* ``inspect``: drain, a person reseats or inspects the hardware;
* ``rma``: drain, return the part (reached by escalation, never an immediate catalogue action).
"""

from __future__ import annotations

import enum
import functools
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuforge.errors import InputError

#: The catalogue shipped inside the package (the wheel carries every file under src/gpuforge).
CATALOGUE_PATH = Path(__file__).with_name("data") / "xid_catalogue.yaml"
SCHEMA = 1

_E = TypeVar("_E", bound=enum.StrEnum)


class Action(enum.StrEnum):
    """What to do about a fault, weakest first (:attr:`rank` orders them)."""

    NONE = "none"
    MONITOR = "monitor"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    INSPECT = "inspect"
    RMA = "rma"

    @property
    def rank(self) -> int:
        """0 for ``none`` up to 5 for ``rma``: the stronger of two actions wins."""
        return list(Action).index(self)

    @property
    def drains(self) -> bool:
        """True for the actions that take the node out of service (``reset_gpu`` and stronger)."""
        return self.rank >= Action.RESET_GPU.rank


class Severity(enum.StrEnum):
    """Alert severity of a catalogue entry."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


#: The severity each action implies; the loader refuses an entry that disagrees.
SEVERITY_OF = {
    Action.NONE: Severity.INFO,
    Action.MONITOR: Severity.WARNING,
    Action.RESET_GPU: Severity.CRITICAL,
    Action.REBOOT: Severity.CRITICAL,
    Action.INSPECT: Severity.CRITICAL,
    Action.RMA: Severity.CRITICAL,
}

CATEGORIES = frozenset(
    {"application", "memory", "nvlink", "bus", "gsp", "driver", "hardware", "unknown"}
)


@dataclass(frozen=True, slots=True)
class Source:
    """Where an entry's facts come from: a URL, the document and the section in it."""

    key: str
    url: str
    document: str
    section: str


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One Xid code: what it means and what gpuforge does about it."""

    code: int
    name: str
    mnemonic: str
    meaning: str
    category: str
    action: Action
    severity: Severity
    user_caused: bool
    """NVIDIA sends the operator to the application first: alone, it never drains a node."""
    documented: bool
    """False where NVIDIA's current catalog lists the code as unused (the entry says why)."""
    nvidia_immediate: str
    nvidia_investigatory: str
    gpud_actions: tuple[str, ...]
    sources: tuple[Source, ...]
    note: str = ""


#: What an Xid not in the catalogue gets: a warning, never a drain on unknown evidence.
UNKNOWN = XidEntry(
    code=-1,
    name="not in gpuforge's Xid catalogue",
    mnemonic="",
    meaning="An Xid code the catalogue does not list; read the message and NVIDIA's catalog.",
    category="unknown",
    action=Action.MONITOR,
    severity=Severity.WARNING,
    user_caused=False,
    documented=False,
    nvidia_immediate="",
    nvidia_investigatory="",
    gpud_actions=(),
    sources=(),
)


@dataclass(frozen=True, slots=True)
class XidCatalogue:
    """Every catalogued Xid by code, and the sources they cite."""

    entries: Mapping[int, XidEntry]
    sources: Mapping[str, Source]

    def get(self, code: int) -> XidEntry:
        """The entry for ``code``, or :data:`UNKNOWN` (with ``code`` filled in)."""
        entry = self.entries.get(code)
        if entry is not None:
            return entry
        return _replace_code(UNKNOWN, code)


def _replace_code(entry: XidEntry, code: int) -> XidEntry:
    fields = {name: getattr(entry, name) for name in XidEntry.__slots__}
    fields["code"] = code
    return XidEntry(**fields)


_ENTRY_KEYS = {
    "code",
    "name",
    "mnemonic",
    "meaning",
    "category",
    "action",
    "severity",
    "user_caused",
    "documented",
    "nvidia",
    "gpud",
    "source",
    "note",
}


class _Reader:
    """Field access that names the file and the key of anything wrong."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, why: str) -> InputError:
        return InputError(f"{self.path}: {key}: {why}")

    def text(self, data: Mapping[str, Any], key: str, where: str, *, empty: bool = False) -> str:
        value = data.get(key, "" if empty else None)
        if not isinstance(value, str) or (not empty and not value.strip()):
            raise self.fail(f"{where}.{key}", f"must be a non-empty string, got {value!r}")
        return value

    def flag(self, data: Mapping[str, Any], key: str, where: str) -> bool:
        value = data.get(key)
        if not isinstance(value, bool):
            raise self.fail(f"{where}.{key}", f"must be true or false, got {value!r}")
        return value

    def choice(self, data: Mapping[str, Any], key: str, where: str, kind: type[_E]) -> _E:
        value = data.get(key)
        allowed = [m.value for m in kind]
        if not isinstance(value, str) or value not in allowed:
            raise self.fail(
                f"{where}.{key}", f"unknown {key} {value!r} (one of {', '.join(allowed)})"
            )
        return kind(value)


def _sources(reader: _Reader, raw: object) -> dict[str, Source]:
    if not isinstance(raw, dict) or not raw:
        raise reader.fail("sources", "must map a key to {url, document, section}")
    out = {}
    for key, value in raw.items():
        where = f"sources.{key}"
        if not isinstance(value, dict):
            raise reader.fail(where, "must be a mapping with url, document, section")
        url = reader.text(value, "url", where)
        if not url.startswith("https://"):
            raise reader.fail(f"{where}.url", f"must be an https URL, got {url!r}")
        out[str(key)] = Source(
            str(key),
            url,
            reader.text(value, "document", where),
            reader.text(value, "section", where),
        )
    return out


def _entry(reader: _Reader, raw: object, index: int, sources: Mapping[str, Source]) -> XidEntry:
    if not isinstance(raw, dict):
        raise reader.fail(f"xids[{index}]", "must be a mapping")
    code = raw.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or code < 0:
        raise reader.fail(f"xids[{index}].code", f"must be a non-negative integer, got {code!r}")
    where = f"xids[{code}]"
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise reader.fail(f"{where}.{unknown[0]}", "unknown key")
    action = reader.choice(raw, "action", where, Action)
    severity = reader.choice(raw, "severity", where, Severity)
    if severity is not SEVERITY_OF[action]:
        raise reader.fail(
            f"{where}.severity",
            f"{severity.value!r} does not fit action {action.value!r} "
            f"(expected {SEVERITY_OF[action].value!r})",
        )
    category = reader.text(raw, "category", where)
    if category not in CATEGORIES:
        raise reader.fail(
            f"{where}.category", f"unknown category {category!r} (one of {sorted(CATEGORIES)})"
        )
    cited = raw.get("source")
    if not isinstance(cited, list) or not cited:
        raise reader.fail(f"{where}.source", "must list at least one key of `sources`")
    missing = [c for c in cited if c not in sources]
    if missing:
        raise reader.fail(f"{where}.source", f"unknown source {missing[0]!r}")
    nvidia = raw.get("nvidia")
    if not isinstance(nvidia, dict):
        raise reader.fail(f"{where}.nvidia", "must be {immediate, investigatory}")
    gpud = raw.get("gpud", [])
    if not isinstance(gpud, list) or not all(isinstance(g, str) for g in gpud):
        raise reader.fail(f"{where}.gpud", "must be a list of gpud repair actions")
    return XidEntry(
        code=code,
        name=reader.text(raw, "name", where),
        mnemonic=reader.text(raw, "mnemonic", where),
        meaning=reader.text(raw, "meaning", where),
        category=category,
        action=action,
        severity=severity,
        user_caused=reader.flag(raw, "user_caused", where),
        documented=reader.flag(raw, "documented", where),
        nvidia_immediate=reader.text(nvidia, "immediate", f"{where}.nvidia"),
        nvidia_investigatory=reader.text(nvidia, "investigatory", f"{where}.nvidia", empty=True),
        gpud_actions=tuple(gpud),
        sources=tuple(sources[c] for c in cited),
        note=reader.text(raw, "note", where, empty=True),
    )


def load(path: Path | None = None) -> XidCatalogue:
    """Read and validate a catalogue file (default: the packaged one).

    Raises :class:`~gpuforge.errors.InputError` naming the file and the key of the first
    problem: an unknown action, a severity that does not fit its action, a missing source, a
    code listed twice.
    """
    packaged = path is None
    path = path or CATALOGUE_PATH
    reader = _Reader(path)
    try:
        if packaged:
            # Through the package loader: the node checker runs from a zipapp (no file path).
            raw = pkgutil.get_data(__package__ or "gpuforge.validate", "data/xid_catalogue.yaml")
            text = (raw or b"").decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the Xid catalogue: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}:{line}: not valid YAML") from None
    if not isinstance(data, dict):
        raise reader.fail("(top)", "must be a mapping with schema, sources, xids")
    if data.get("schema") != SCHEMA:
        raise reader.fail("schema", f"must be {SCHEMA}, got {data.get('schema')!r}")
    sources = _sources(reader, data.get("sources"))
    raw_entries = data.get("xids")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise reader.fail("xids", "must be a non-empty list")
    entries: dict[int, XidEntry] = {}
    for index, raw in enumerate(raw_entries):
        entry = _entry(reader, raw, index, sources)
        if entry.code in entries:
            raise reader.fail(f"xids[{entry.code}].code", "listed twice")
        entries[entry.code] = entry
    return XidCatalogue(entries=dict(sorted(entries.items())), sources=sources)


@functools.cache
def catalogue() -> XidCatalogue:
    """The packaged catalogue, read once per process."""
    return load()


def lookup(code: int) -> XidEntry:
    """The packaged catalogue's entry for ``code`` (:data:`UNKNOWN` when not listed)."""
    return catalogue().get(code)
