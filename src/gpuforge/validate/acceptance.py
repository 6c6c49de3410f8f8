"""Running the testinfra acceptance suite (validators/) and reading back its results.

The suite runs from the operator machine over SSH (``pytest validators/
--hosts=ansible://gpu_nodes -n auto`` with ``ANSIBLE_INVENTORY`` naming both layers of the
cluster directory); its pytest plugin
(validators/conftest.py) writes one :class:`~gpuforge.validate.result.CheckResult` per test into a
JSON file, which :func:`read_results` loads.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuforge.command import TIMEOUT_RC, CommandResult, remote_line, run_argv
from gpuforge.errors import InputError
from gpuforge.inventory.reader import InventoryDir
from gpuforge.resources import project_path
from gpuforge.validate.result import CheckResult

VALIDATORS = project_path("validators")
RESULTS_SCHEMA = 1


class _Cmd(Protocol):
    rc: int
    stdout: str
    stderr: str


class _Host(Protocol):
    def run(self, command: str) -> _Cmd: ...


class ProbeFailed(AssertionError):  # noqa: N818 - reads as a verdict in the suite
    """The tool hung, is missing or reported an error: a failed check, with the evidence."""

    def __init__(self, result: CommandResult, what: str) -> None:
        self.result = result
        super().__init__(f"{what}\n{result.evidence()}")


def probe(host: _Host, command: str, *, timeout: float, label: str = "") -> CommandResult:
    """Run ``command`` on a testinfra ``host`` under coreutils ``timeout``; never hangs."""
    start = time.monotonic()
    out = host.run(remote_line(command, timeout))
    rc = int(out.rc)
    return CommandResult(
        host=label,
        command=command,
        rc=rc,
        stdout=out.stdout,
        stderr=out.stderr,
        duration_s=time.monotonic() - start,
        timed_out=rc == TIMEOUT_RC,
    )


def tool_output(host: _Host, command: str, *, timeout: float, label: str = "") -> CommandResult:
    """Like :func:`probe`, but a hang, a missing tool or a non-zero exit is a failed check."""
    res = probe(host, command, timeout=timeout, label=label)
    if res.timed_out:
        raise ProbeFailed(res, f"hung: {command} did not finish in {timeout:.0f}s")
    if res.rc == 127:
        raise ProbeFailed(res, f"missing: {command.split(maxsplit=1)[0]} is not installed")
    if res.rc != 0:
        raise ProbeFailed(res, f"{command.split(maxsplit=1)[0]} exited {res.rc}")
    return res


def parse_or_inconclusive(parser: Callable[[str], Any], res: CommandResult) -> Any:
    """Parse a tool's output; unreadable output is inconclusive (error), not a failure."""
    try:
        return parser(res.stdout)
    except Exception as exc:
        raise Inconclusive(f"cannot read {res.command!r}: {exc}\n{res.evidence()}") from exc


class Inconclusive(RuntimeError):  # noqa: N818 - reads as a verdict in the suite
    """The check could not conclude (unparsable output): recorded as ``error`` (hold)."""


@dataclass(frozen=True)
class SuiteRun:
    """A finished run of the suite."""

    rc: int
    results: tuple[CheckResult, ...]
    output: str
    command: tuple[str, ...]


def suite_command(
    hosts: Sequence[str],
    results: Path,
    *,
    workers: int | str = "auto",
    validators: Path = VALIDATORS,
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line of the acceptance suite for ``hosts``.

    The inventory comes from ``ANSIBLE_INVENTORY`` (:func:`run_suite`): testinfra's
    ``--ansible-inventory`` takes one source, a cluster directory has two layers.
    """
    if not hosts:
        raise InputError("no hosts to validate")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        str(validators),
        "-p",
        "no:cacheprovider",
        f"--rootdir={validators}",
        "-c",
        str(validators / "pytest.ini"),
        f"--hosts={','.join('ansible://' + h for h in hosts)}",
        f"--gpuforge-results={results}",
        "-q",
    ]
    if workers not in (0, "0", 1, "1"):
        argv += ["-n", str(workers)]
    return argv + list(extra)


def run_suite(
    inventory: Path, hosts: Sequence[str], work_dir: Path, *, timeout: float = 1800.0
) -> SuiteRun:
    """Run the suite on ``hosts`` of the cluster directory ``inventory``; bounded by ``timeout``."""
    env = InventoryDir.open(inventory).ansible_env()
    work_dir.mkdir(parents=True, exist_ok=True)
    results = work_dir / "acceptance-results.json"
    results.unlink(missing_ok=True)
    argv = suite_command(hosts, results)
    res = run_argv("localhost", shlex.join(argv), argv, timeout=timeout, env=env)
    loaded = read_results(results) if results.exists() else ()
    return SuiteRun(
        res.rc if res.rc is not None else TIMEOUT_RC,
        loaded,
        res.evidence(),
        tuple(argv),
    )


def read_results(path: Path) -> tuple[CheckResult, ...]:
    """Load the plugin's results file; InputError if it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not an acceptance results file: {exc}") from exc
    if data.get("schema") != RESULTS_SCHEMA:
        raise InputError(f"{path}: unknown schema {data.get('schema')!r}")
    return tuple(CheckResult.from_dict(r) for r in data["results"])
