"""Drift: what a node is now against what its roles recorded it should be (issue 17).

Every role writes the desired state it made the node into under ``/etc/gpuforge/expected/``
(``roles/_common/tasks/expected_state.yml``: one ``state/<role>.json`` per role; the fabric roles'
``fabric.json`` is read for its sysctls). :func:`compare` reads the node through a
:class:`System` (one ``dpkg-query``, one ``lsmod``, one ``systemctl show``, file reads) and
returns one :class:`DriftItem` per difference, naming the item, the desired and the actual value.

Runs on the node with the standard library only (the node checker's zipapp); every command has a
timeout, and a command that cannot run makes the comparison of that kind an error, never drift.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuforge.node import filediff, record
from gpuforge.textfile import Family, render
from gpuforge.validate import checks
from gpuforge.validate.result import CheckResult, Status

#: Where the roles record the desired state.
EXPECTED_DIR = Path("/etc/gpuforge/expected")
#: The subdirectory ``expected_state.yml`` writes one ``<role>.json`` into (beside the
#: validators' own expectation files such as ``fabric.json`` and ``nccl.json``).
STATE_SUBDIR = "state"
#: The format ``expected_state.yml`` writes.
EXPECTED_SCHEMA = "gpuforge.expected/1"
#: The drift kinds, as in the record (docs/conformance.md).
KINDS = ("package", "file", "sysctl", "module", "service", "limit", "slurm", "firmware")
#: Seconds one probe command may take.
PROBE_TIMEOUT = 10.0
#: The name of the drift check in records, reasons and metrics.
CHECK = "conformance.drift"
#: Where systemd-sysctl reads ``*.conf`` at boot, in order of precedence (sysctl.d(5)).
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d")
#: Files bigger than this are not hashed (a rendered config file never is).
MAX_FILE_BYTES = 64 * 1024 * 1024

_LIMIT_LINE = re.compile(r"^\s*(\S+)\s+(soft|hard|-)\s+(\S+)\s+(\S+)\s*$")


class ProbeError(RuntimeError):
    """A probe could not read the node (command missing, hung, failed)."""


@dataclass(frozen=True)
class DriftItem:
    """One difference between the desired and the actual state."""

    kind: str
    item: str
    desired: str
    actual: str
    role: str = ""

    def to_dict(self) -> dict[str, str]:
        """The record's ``drift`` entry (``role`` says which expected file asked for it)."""
        out = {"kind": self.kind, "item": self.item, "desired": self.desired}
        out["actual"] = self.actual
        if self.role:
            out["role"] = self.role
        return out


@dataclass(frozen=True)
class Expected:
    """The desired state one role recorded."""

    role: str
    path: Path
    packages: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    sysctls: Mapping[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    services: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)
    limits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Packages the role left on hold (dpkg's selection state): part of a pinned package's
    #: desired state, since apt moves a package whose hold was released on the next upgrade.
    holds: tuple[str, ...] = ()


@dataclass
class DriftReport:
    """Every difference found, and every kind that could not be compared (with why)."""

    items: list[DriftItem] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    compared: int = 0
    diffs: list[str] = field(default_factory=list)  # drifted files against their rendering

    def check(self) -> CheckResult:
        """The ``conformance.drift`` check of the record.

        fail when anything drifted (action ``quarantine``: re-run the roles, re-validate); error
        when nothing drifted but something could not be compared or nothing was recorded at all;
        else pass.
        """
        kinds = sorted({i.kind for i in self.items})
        if self.items:
            status, action = "fail", "quarantine"
            measured = f"{len(self.items)} item(s) drifted: " + ", ".join(
                f"{k}={sum(1 for i in self.items if i.kind == k)}" for k in kinds
            )
        elif self.errors or not self.roles:
            status, action = "error", ""
            measured = "not compared"
        else:
            status, action = "pass", ""
            measured = f"{self.compared} item(s) as recorded"
        message = "; ".join(self.errors) if self.errors else ""
        if not self.roles:
            message = (message + "; " if message else "") + "no expected state recorded"
        evidence = "\n".join(
            f"{i.kind} {i.item}: desired {i.desired!r}, actual {i.actual!r}" for i in self.items
        )
        evidence = filediff.with_diffs(evidence, self.diffs)
        return CheckResult(
            node="",
            check=CHECK,
            status=Status(status),
            action=action,
            measured=measured,
            expected="as the roles recorded in " + str(EXPECTED_DIR),
            message=record.clip(message),
            evidence=evidence[: record.TEXT_MAX],
        )


class System(Protocol):
    """What :func:`compare` reads from the node; tests pass a fake."""

    def packages(self, names: Sequence[str]) -> dict[str, str]:
        """Installed version per package name (absent: not installed)."""

    def holds(self, names: Sequence[str]) -> set[str]:
        """The packages of ``names`` on hold (dpkg's selection state ``hold``)."""

    def file_digest(self, path: str) -> str | None:
        """``sha256:<hex>`` of the file, or None when it does not exist."""

    def sysctl(self, key: str) -> str | None:
        """The live value (whitespace normalized), or None when the key does not exist."""

    def sysctls_at_boot(self) -> dict[str, str] | None:
        """What the sysctl.d files set at boot where ``/proc/sys`` is read-only (a container,
        which cannot hold live values), else None."""

    def modules(self) -> set[str]:
        """Loaded kernel modules."""

    def services(self, names: Sequence[str]) -> dict[str, tuple[bool, bool]]:
        """``(enabled, active)`` per unit."""

    def read_text(self, path: str) -> str | None:
        """A small text file's contents, or None when it does not exist."""


# -- loading the expected state ----------------------------------------------------------------


class ExpectedError(ValueError):
    """An expected-state file that cannot be read: names the file and the field."""


def _str_map(path: Path, key: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ExpectedError(f"{path}: {key}: must be a mapping")
    return {str(k): _scalar(v) for k, v in value.items()}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return " ".join(str(value).split())


def parse_expected(path: Path, data: Any) -> Expected:
    """One expected file's content as :class:`Expected`; ExpectedError naming the field."""
    if not isinstance(data, dict):
        raise ExpectedError(f"{path}: not a JSON object")
    if data.get("schema") == EXPECTED_SCHEMA:
        role = data.get("role")
        if not isinstance(role, str) or not role:
            raise ExpectedError(f"{path}: role: must be a non-empty string")
        services: dict[str, dict[str, bool]] = {}
        raw_services = data.get("services") or {}
        if not isinstance(raw_services, dict):
            raise ExpectedError(f"{path}: services: must be a mapping")
        for name, want in raw_services.items():
            if not isinstance(want, dict) or not all(
                isinstance(want.get(k, True), bool) for k in ("enabled", "active")
            ):
                raise ExpectedError(
                    f"{path}: services.{name}: must be {{enabled, active}} booleans"
                )
            services[str(name)] = {k: bool(want[k]) for k in ("enabled", "active") if k in want}
        modules = data.get("modules") or []
        if not isinstance(modules, list):
            raise ExpectedError(f"{path}: modules: must be a list")
        limits_raw = data.get("limits") or {}
        if not isinstance(limits_raw, dict) or not all(
            isinstance(v, list) for v in limits_raw.values()
        ):
            raise ExpectedError(f"{path}: limits: must map a file to a list of lines")
        limits = {str(k): tuple(_limit_key(str(line)) for line in v) for k, v in limits_raw.items()}
        holds = data.get("holds") or []
        if not isinstance(holds, list) or not all(isinstance(h, str) and h for h in holds):
            raise ExpectedError(f"{path}: holds: must be a list of package names")
        files = _str_map(path, "files", data.get("files"))
        for name, digest in files.items():
            if not digest.startswith("sha256:"):
                raise ExpectedError(f"{path}: files.{name}: must be sha256:<hex>")
        return Expected(
            role=role,
            path=path,
            packages=_str_map(path, "packages", data.get("packages")),
            files=files,
            sysctls=_str_map(path, "sysctls", data.get("sysctls")),
            modules=tuple(str(m) for m in modules),
            services=services,
            limits=limits,
            holds=tuple(holds),
        )
    if data.get("schema") == 1 and data.get("kind") in {"infiniband", "roce"}:
        # The fabric roles' own file: its sysctls are desired state too.
        return Expected(
            role=str(data["kind"]),
            path=path,
            sysctls=_str_map(path, "sysctls", data.get("sysctls")),
        )
    raise ExpectedError(f"{path}: schema: unknown {data.get('schema')!r}")


def _limit_key(line: str) -> str:
    match = _LIMIT_LINE.match(line)
    if match is None:
        raise ExpectedError(f"limits: {line!r} is not '<domain> <type> <item> <value>'")
    return " ".join(match.groups())


def load_expected(directory: Path = EXPECTED_DIR) -> tuple[list[Expected], list[str]]:
    """Every readable ``state/<role>.json`` (and ``fabric.json``) under ``directory``, and one error
    line per unreadable one."""
    found: list[Expected] = []
    errors: list[str] = []
    try:
        paths = sorted((directory / STATE_SUBDIR).glob("*.json"))
    except OSError as exc:
        return [], [f"{directory / STATE_SUBDIR}: {exc.strerror or exc}"]
    # The fabric roles' own expectations file (for the validators) names sysctls too.
    paths += [p for p in (directory / "fabric.json",) if p.is_file()]
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            found.append(parse_expected(path, data))
        except (OSError, ValueError) as exc:  # ExpectedError is a ValueError
            errors.append(str(exc) if isinstance(exc, ExpectedError) else f"{path}: {exc}")
    return found, errors


# -- comparing ---------------------------------------------------------------------------------


def _guard(report: DriftReport, kind: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ProbeError as exc:
        report.errors.append(f"{kind}: {exc}")
        return None


def _compare_sysctls(report: DriftReport, expected: Expected, system: System) -> None:
    at_boot: dict[str, str] | None = None
    asked = False  # sysctls_at_boot is read once, and only when a live value differs
    for key, want in sorted(expected.sysctls.items()):
        report.compared += 1
        try:
            got = system.sysctl(key)
            if got == want:
                continue
            # Nothing can set a read-only /proc/sys (a container's): there the values the node
            # applies at boot are judged, as the validators' fabric.sysctls does.
            if not asked:
                at_boot, asked = system.sysctls_at_boot(), True
        except ProbeError as exc:
            report.errors.append(f"sysctl: {exc}")
            continue
        actual = got or "absent"
        if at_boot is not None:
            if at_boot.get(key) == want:
                continue
            actual = f"{at_boot.get(key, 'unset')} at boot (/proc/sys read-only)"
        report.items.append(DriftItem("sysctl", key, want, actual, expected.role))


#: A released hold's drift item: ``package <name> hold: desired 'held', actual 'not held'``.
HOLD_SUFFIX = " hold"


def _compare_holds(
    report: DriftReport, todo: Sequence[Expected], have: Mapping[str, str], system: System
) -> None:
    """Each package its role left on hold and still installed is on hold now (one query)."""
    wanted = {p: e.role for e in todo for p in e.holds if p in have}
    if not wanted:
        return  # a package no longer installed is drift already, its hold is moot
    held = _guard(report, "package hold", system.holds, sorted(wanted))
    if held is None:
        return
    for name, role in sorted(wanted.items()):
        report.compared += 1
        if name not in held:
            report.items.append(DriftItem("package", name + HOLD_SUFFIX, "held", "not held", role))


def compare(expected: Iterable[Expected], system: System) -> DriftReport:  # noqa: PLR0912
    """Every difference between ``expected`` and what ``system`` reads from the node."""
    report = DriftReport()
    todo = list(expected)
    report.roles = [e.role for e in todo]

    packages = {p: (e.role, v) for e in todo for p, v in e.packages.items()}
    if packages:
        have = _guard(report, "package", system.packages, sorted(packages))
        if have is not None:
            for name, (role, want) in sorted(packages.items()):
                report.compared += 1
                got = have.get(name)
                if got != want:
                    report.items.append(
                        DriftItem("package", name, want, got or "not installed", role)
                    )
            _compare_holds(report, todo, have, system)

    for e in todo:
        for path, want in sorted(e.files.items()):
            report.compared += 1
            try:
                got = system.file_digest(path)
            except ProbeError as exc:
                report.errors.append(f"file: {exc}")
                continue
            if got != want:
                report.items.append(DriftItem("file", path, want, got or "missing", e.role))
                report.diffs.append(filediff.file_diff(e.path, path, system.read_text))
        _compare_sysctls(report, e, system)

    wanted_modules = {m: e.role for e in todo for m in e.modules}
    if wanted_modules:
        loaded = _guard(report, "module", system.modules)
        if loaded is not None:
            for name, role in sorted(wanted_modules.items()):
                report.compared += 1
                if name not in loaded:
                    report.items.append(DriftItem("module", name, "loaded", "not loaded", role))

    units = {u: (e.role, w) for e in todo for u, w in e.services.items()}
    if units:
        states = _guard(report, "service", system.services, sorted(units))
        if states is not None:
            for unit, (role, flags) in sorted(units.items()):
                report.compared += 1
                enabled, active = states.get(unit, (False, False))
                for word, is_now in (("enabled", enabled), ("active", active)):
                    if word in flags and flags[word] != is_now:
                        desired = word if flags[word] else f"not {word}"
                        actual = word if is_now else f"not {word}"
                        report.items.append(DriftItem("service", unit, desired, actual, role))

    for e in todo:
        for path, lines in sorted(e.limits.items()):
            report.compared += 1
            text = system.read_text(path)
            have_lines = set(_limit_lines(text or ""))
            for line in lines:
                if line not in have_lines:
                    report.items.append(
                        DriftItem("limit", f"{path}: {line}", line, "missing", e.role)
                    )
    return report


def _limit_lines(text: str) -> Iterable[str]:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0]
        match = _LIMIT_LINE.match(line)
        if match:
            yield " ".join(match.groups())


# -- the live node ------------------------------------------------------------------------------


def _run(argv: Sequence[str], *, ok: Sequence[int] = (0,)) -> str:
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C"},
        )
    except FileNotFoundError:
        raise ProbeError(f"{argv[0]}: not installed") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"{argv[0]}: no answer in {PROBE_TIMEOUT:.0f}s") from None
    if proc.returncode not in ok:
        raise ProbeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


#: One line per package: its name and dpkg's status (``want ok state``: ``hold ok installed``).
HOLD_QUERY = ("dpkg-query", "-W", "-f=${Package}\t${Status}\n")


def parse_holds(text: str) -> set[str]:
    """The packages on hold in a :data:`HOLD_QUERY` listing."""
    out = set()
    for line in text.splitlines():
        name, _, status = line.partition("\t")
        if name and status.split()[:1] == ["hold"]:
            out.add(name)
    return out


@dataclass
class LiveSystem:
    """The node itself: dpkg (or rpm), lsmod, systemctl, /proc/sys, files."""

    root: Path = Path("/")

    def packages(self, names: Sequence[str]) -> dict[str, str]:
        """Versions from ``dpkg-query`` (``rpm -q`` where there is no dpkg)."""
        if Path("/usr/bin/dpkg-query").exists() or not Path("/usr/bin/rpm").exists():
            # 1: some name is not installed
            return checks.parse_installed(_run([*checks.DPKG_QUERY, *names], ok=(0, 1)))
        out = _run(["rpm", "-q", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n", *names], ok=(0, 1))
        return checks.parse_installed(out)

    def holds(self, names: Sequence[str]) -> set[str]:
        """dpkg's selection state (``${Status}``: ``hold ok installed``), one ``dpkg-query``
        with the probes' timeout; what ``apt-mark showhold`` lists, for these packages only."""
        out = _run([*HOLD_QUERY, *names], ok=(0, 1))  # 1: some name is not installed
        return parse_holds(out)

    def file_digest(self, path: str) -> str | None:
        """sha256 of the file, read in 1 MiB blocks."""
        target = self.root / path.lstrip("/")
        digest = hashlib.sha256()
        try:
            if target.stat().st_size > MAX_FILE_BYTES:
                return "too large to hash"
            with target.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ProbeError(f"{path}: {exc.strerror or exc}") from None
        return "sha256:" + digest.hexdigest()

    def sysctl(self, key: str) -> str | None:
        """``/proc/sys/<key with dots as slashes>``."""
        target = self.root / "proc/sys" / key.replace(".", "/")
        try:
            return " ".join(target.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ProbeError(f"{key}: {exc.strerror or exc}") from None

    def sysctls_at_boot(self) -> dict[str, str] | None:
        """The sysctl.d files' values when ``/proc/sys`` is mounted read-only, else None.

        Read as systemd-sysctl does at boot: a file name in an earlier directory hides the same
        name in a later one, files apply in name order, a later assignment wins, and a leading
        ``-`` (ignore the key if absent) is not part of the key.
        """
        try:
            mounts = (self.root / "proc/self/mounts").read_text(encoding="utf-8")
        except OSError:
            return None
        options = [
            f[3].split(",")
            for f in (m.split() for m in mounts.splitlines())
            if len(f) > 3 and f[1] == "/proc/sys"
        ]
        if not options or "ro" not in options[-1]:
            return None
        files: dict[str, Path] = {}
        for directory in SYSCTL_DIRS:
            try:
                found = sorted((self.root / directory.lstrip("/")).glob("*.conf"))
            except OSError:
                continue
            for path in found:
                files.setdefault(path.name, path)
        values: dict[str, str] = {}
        for name in sorted(files):
            try:
                text = files[name].read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise ProbeError(f"{files[name]}: {exc.strerror or exc}") from None
            # The validators' own reading of ``key = value`` lines (fabric.sysctls).
            for key, value in checks.parse_kv(text).items():
                values[key.lstrip("-").replace("/", ".")] = " ".join(value.split())
        return values

    def modules(self) -> set[str]:
        """Names in ``lsmod`` (what the validators read too)."""
        out = _run(["lsmod"])
        return {line.split()[0] for line in out.splitlines()[1:] if line.strip()}

    def services(self, names: Sequence[str]) -> dict[str, tuple[bool, bool]]:
        """One ``systemctl show`` for every unit."""
        units = [n if "." in n else f"{n}.service" for n in names]
        out = _run(["systemctl", "show", "--property=Id,UnitFileState,ActiveState", *units])
        found: dict[str, tuple[bool, bool]] = {}
        for block in out.strip().split("\n\n"):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            unit = props.get("Id", "")
            name = unit.removesuffix(".service")
            found[name if name in names else unit] = (
                props.get("UnitFileState") in {"enabled", "enabled-runtime", "static", "alias"},
                props.get("ActiveState") in {"active", "reloading"},
            )
        return found

    def read_text(self, path: str) -> str | None:
        """The file's text (at most 1 MiB), None when missing."""
        try:
            with (self.root / path.lstrip("/")).open(encoding="utf-8", errors="replace") as fh:
                return fh.read(1 << 20)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ProbeError(f"{path}: {exc.strerror or exc}") from None


def firmware(sysfs_root: Path = Path("/sys")) -> dict[str, str]:
    """Firmware versions the node reports: VBIOS per GPU model, HCA firmware per device.

    Compared on the controller across nodes of the same type (the odd one out is drift), since a
    node alone cannot know which firmware is right. Missing tools give no entries, never drift.
    """
    out: dict[str, str] = {}
    try:
        text = _run(["nvidia-smi", "--query-gpu=index,vbios_version", "--format=csv,noheader"])
        vbios = sorted({line.split(",", 1)[1].strip() for line in text.splitlines() if "," in line})
        if vbios:
            out["vbios"] = "|".join(vbios)
    except ProbeError:
        pass
    try:
        devices = sorted((sysfs_root / "class/infiniband").iterdir())
    except OSError:
        devices = []
    for dev in devices:
        try:
            out[f"hca/{dev.name}"] = (dev / "fw_ver").read_text(encoding="utf-8").strip()
        except OSError:
            continue
    return out


def run(directory: Path = EXPECTED_DIR, system: System | None = None) -> DriftReport:
    """Load the expected state under ``directory`` and compare it with the node."""
    expected, errors = load_expected(directory)
    report = compare(expected, system or LiveSystem())
    report.errors[:0] = errors
    if errors and not report.roles:
        report.roles = []
    return report


# -- the conformance task (one task of the nightly job array) ---------------------------------

#: Levels of ``gpuforge-node conformance``; ``burnin`` adds DCGM level 2 on the node.
LEVELS = ("passive", "quick", "burnin")


def conformance_record(
    node: str,
    level: str,
    *,
    started: str,
    duration_s: float,
    passive: Sequence[CheckResult] = (),
    report: DriftReport,
    firmware_versions: Mapping[str, str],
    job_id: str | None = None,
    extra: Sequence[CheckResult] = (),
) -> dict[str, Any]:
    """The one record a conformance task hands back (docs/health.md's record, tier
    ``conformance``).

    ``passive``: the passive tier's checks (the node checker's), ``extra``: the level's own
    (``gpu.dcgm_diag`` at burnin). Firmware goes in ``conformance.firmware`` (shadow: judged on
    the controller, across the node type), with the versions as ``measured``.
    """
    if level not in LEVELS:
        raise ValueError(f"level: {level!r} is not one of {', '.join(LEVELS)}")
    firmware = CheckResult(
        node=node,
        check="conformance.firmware",
        status=Status.PASS if firmware_versions else Status.SKIP,
        measured=json.dumps(dict(sorted(firmware_versions.items()))),
        expected="same as the other nodes of the type",
        shadow=True,
    )
    checks = (*passive, report.check(), *extra, firmware)
    return record.Record(
        node=node,
        tier="conformance",
        level=level,
        started=started,
        duration_s=round(duration_s, 3),
        verdict=record.verdict_of(checks),
        checks=checks,
        job_id=job_id,
        drift=tuple(record.Drift(i.kind, i.item, i.desired, i.actual) for i in report.items),
    ).to_dict()


_STATUS_CODE = {"pass": 0, "warn": 1, "fail": 2, "error": 3}


def metrics_text(record: Mapping[str, Any], now: float) -> str:
    """``gpuforge_conformance_*`` textfile metrics of one record (names in docs/conformance.md)."""
    counts = dict.fromkeys(KINDS, 0)
    for item in record.get("drift", []):
        counts[str(item.get("kind"))] = counts.get(str(item.get("kind")), 0) + 1
    return render(
        [
            Family(
                "gpuforge_conformance_drift_items",
                "Drifted items per kind, last conformance run.",
                "gauge",
                [({"kind": k}, v) for k, v in sorted(counts.items())],
            ),
            Family.single(
                "gpuforge_conformance_last_run_timestamp_seconds",
                "End of the last conformance run.",
                round(now),
            ),
            Family.single(
                "gpuforge_conformance_status",
                "Verdict: 0 pass, 1 warn, 2 fail, 3 error.",
                _STATUS_CODE.get(str(record.get("verdict")), 3),
            ),
        ]
    )
