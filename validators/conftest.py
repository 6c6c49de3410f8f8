"""Pytest plugin of the acceptance suite: expectations from the inventory, results to JSON.

Run from the operator machine::

    ANSIBLE_INVENTORY=inventory/lab/generated,inventory/lab/site \
    pytest validators/ -c validators/pytest.ini --hosts=ansible://gpu_nodes \
        --gpuforge-results=build/acceptance.json -n auto

Every test records one :class:`gpuforge.validate.result.CheckResult` (node = the inventory host
name): an ``assert`` that fails is ``fail``; a tool that hangs, is missing or exits non-zero is
``fail`` with its evidence; output that cannot be parsed, or a host that cannot be reached, is
``error`` (inconclusive: the node is held, never drained on that alone).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

from gpuforge.atomic import atomic_open
from gpuforge.command import CommandResult
from gpuforge.validate import catalogue
from gpuforge.validate.acceptance import RESULTS_SCHEMA, ProbeFailed, tool_output
from gpuforge.validate.checks import JudgeOutcome
from gpuforge.validate.result import CheckResult, Level, Status

_STATUS = "gpuforge_status"
_RECORD = "gpuforge_record"
_NODE = "gpuforge_node"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpuforge-results",
        default=None,
        help="write one JSON CheckResult per test to this file",
    )
    parser.addoption(
        "--gpuforge-timeout",
        type=float,
        default=60.0,
        help="seconds any one command on a node may take (it is killed after)",
    )


# --- facts and expectations ----------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``rail`` runs over the rails the nodes under test have, read from the inventory."""
    if "rail" in metafunc.fixturenames:
        metafunc.parametrize("rail", range(_rail_count(metafunc.config)), scope="module")


def _rail_count(config: pytest.Config) -> int:
    """The most compute rails of any node in ``--hosts`` (its node type's ``rails``).

    ``ansible://PATTERN`` hosts are looked up in the inventory (one ``ansible-inventory`` run,
    the same testinfra makes to find the hosts); any other host, e.g. ``local://`` on a node,
    by the fabric role's ``/etc/gpuforge/expected/fabric.json``.
    """
    count = 0
    for spec in str(config.option.hosts or "").split(","):
        if spec.startswith("ansible://"):
            runner = AnsibleRunner.get_runner(config.option.ansible_inventory)
            pattern = spec.removeprefix("ansible://").split("?", 1)[0] or "all"
            for name in runner.get_hosts(pattern):
                node_type = runner.get_variables(name).get("gpu_node_type") or {}
                count = max(count, len(node_type.get("rails") or []))
        elif spec:
            expected = testinfra.get_host(spec).file("/etc/gpuforge/expected/fabric.json")
            if expected.exists:
                count = max(count, len(json.loads(expected.content_string).get("rails") or []))
    return count


@dataclass
class Node:
    """One node under test: its name, inventory variables and a per-node output cache."""

    name: str
    vars: dict[str, Any]
    host: Any
    timeout: float
    cache: dict[str, CommandResult] = field(default_factory=dict)

    def output(self, command: str, timeout: float | None = None) -> CommandResult:
        """The command's output (run once per node); a hang/missing tool/rc != 0 fails the test."""
        if command not in self.cache:
            try:
                self.cache[command] = tool_output(
                    self.host, command, timeout=timeout or self.timeout, label=self.name
                )
            except ProbeFailed as exc:
                self.cache[command] = exc.result
                raise
        res = self.cache[command]
        if not res.ok:
            raise ProbeFailed(res, f"{command.split(maxsplit=1)[0]} failed earlier on this node")
        return res

    @property
    def node_type(self) -> dict[str, Any]:
        value = self.vars.get("gpu_node_type") or {}
        return dict(value)

    def expected_fabric(self) -> dict[str, Any]:
        """/etc/gpuforge/expected/fabric.json written by the fabric role, or {} when absent."""
        f = self.host.file("/etc/gpuforge/expected/fabric.json")
        if not f.exists:
            return {}
        data: dict[str, Any] = json.loads(f.content_string)
        return data


_NODES: dict[str, Node] = {}


def _host_name(host: Any) -> str:
    try:
        return str(host.backend.get_hostname())
    except Exception:
        return str(host.backend.host)


@pytest.fixture(scope="module")
def node(host: Any, request: pytest.FixtureRequest) -> Node:
    """The node under test (variables read once per host)."""
    name = _host_name(host)
    if name not in _NODES:
        try:
            variables = dict(host.ansible.get_variables())
        except Exception:
            variables = {}
        _NODES[name] = Node(
            name, variables, host, float(request.config.getoption("--gpuforge-timeout"))
        )
    return _NODES[name]


class Recorder:
    """What a test saw; ``check`` records and asserts in one step."""

    def __init__(self, item: pytest.Item, node_name: Callable[[], str]) -> None:
        self.item = item
        self.node_name = node_name

    def check(
        self, name: str, outcome: JudgeOutcome, evidence: str = "", *, warn: bool = False
    ) -> None:
        """Record ``outcome`` under check ``name`` and fail the test when it is not ok.

        ``warn=True`` (or an outcome that is ``warn_only``) records a non-ok outcome as
        ``warn`` and lets the test pass.
        """
        warn = warn or outcome.warn_only
        self.item.user_properties.append(
            (
                _RECORD,
                {
                    "check": name,
                    "measured": outcome.measured,
                    "expected": outcome.expected,
                    "evidence": evidence,
                    "message": outcome.detail,
                    "warn": warn and not outcome.ok,
                    # One action per failure on every path: the judge's, else the catalogue's.
                    "action": catalogue.result_action(
                        name, ok=outcome.ok, warn=warn, named=outcome.action
                    ),
                },
            )
        )
        if not warn:
            assert outcome.ok, f"{name}: {outcome.explain()}"


@pytest.fixture
def record(request: pytest.FixtureRequest, node: Node) -> Recorder:
    """Record a check's measured/expected/evidence for the JSON results."""
    request.node.user_properties.append((_NODE, node.name))
    return Recorder(request.node, lambda: node.name)


# --- turning pytest outcomes into CheckResults ----------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        if rep.skipped:
            status = Status.SKIP
        elif rep.passed:
            warned = any(k == _RECORD and v.get("warn") for k, v in item.user_properties)
            status = Status.WARN if warned else Status.PASS
        elif call.excinfo is not None and call.excinfo.errisinstance(AssertionError):
            status = Status.FAIL
        else:
            status = Status.ERROR
        rep.user_properties.append((_STATUS, status.value))
        rep.user_properties.append(("gpuforge_duration", call.stop - call.start))
        if not any(k == _NODE for k, _ in rep.user_properties):
            host = getattr(item, "funcargs", {}).get("host")
            if host is not None:
                rep.user_properties.append((_NODE, _host_name(host)))


_RESULTS: list[dict[str, Any]] = []


def _check_name(nodeid: str, node: str = "") -> str:
    """``validators/test_gpu.py::test_ecc_enabled[ansible://gpu001]`` -> ``gpu.ecc_enabled``."""
    module, _, rest = nodeid.partition("::")
    func, _, params = rest.partition("[")
    group = Path(module).stem.removeprefix("test_")
    name = f"{group}.{func.removeprefix('test_')}"
    extra = [p for p in params.rstrip("]").split("-") if p and "://" not in p and p != node]
    return name + (f"[{'-'.join(extra)}]" if extra else "")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = {k: v for k, v in report.user_properties if k != _RECORD}
    if _STATUS not in props:
        return
    records = [v for k, v in report.user_properties if k == _RECORD]
    status = Status(props[_STATUS])
    node = str(props.get(_NODE) or "unknown")
    text = str(report.longreprtext or "") if status in (Status.FAIL, Status.ERROR) else ""
    if not records:
        check = _check_name(report.nodeid, node)
        # A hung or failing tool fails the check it serves, with that check's catalogue action.
        action = catalogue.action(check) if status is Status.FAIL else ""
        records = [{"check": check, "measured": None, "expected": None, "action": action}]
    for i, rec in enumerate(records):
        last = i == len(records) - 1
        st = status if last else (Status.WARN if rec.get("warn") else Status.PASS)
        if last and status is Status.PASS and rec.get("warn"):
            st = Status.WARN
        evidence = str(rec.get("evidence") or "")
        if last and text:
            evidence = (evidence + "\n" + text[-1500:]).strip()
        _RESULTS.append(
            CheckResult(
                node=node,
                check=str(rec["check"]),
                status=st,
                measured=rec.get("measured"),
                expected=rec.get("expected"),
                evidence=evidence,
                duration_s=float(props.get("gpuforge_duration", 0.0)),
                level=Level.QUICK,
                message=str(rec.get("message") or ""),
                action=str(rec.get("action") or ""),
            ).to_dict()
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--gpuforge-results")
    if not path or hasattr(session.config, "workerinput"):
        return  # xdist workers report to the controller, which writes the file
    with atomic_open(Path(path), mode=0o600) as handle:
        json.dump(
            {"schema": RESULTS_SCHEMA, "written_at": time.time(), "results": _RESULTS},
            handle,
            indent=1,
        )
