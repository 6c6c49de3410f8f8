"""From each node's record to its outcome; firmware compared across the node type, Slurm's view
of each node compared with the generated ``nodes.conf``."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import hostlist

from gpuforge.errors import InputError
from gpuforge.history.conformance import NodeResult, failed_check
from gpuforge.node import record as node_record
from gpuforge.node.record import Drift
from gpuforge.slurm.control import SlurmNode
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, decide

#: The check whose ``measured`` carries the node's firmware versions (shadow on the node).
FIRMWARE_CHECK = "conformance.firmware"
#: The check a firmware odd-one-out fails (it joins the drift check in the drain reason).
DRIFT_CHECK = "conformance.drift"
#: The settings of a ``NodeName=`` line compared with ``scontrol show node`` (its field for each).
#: The nodes are configless, so only the controller holds these lines: it compares them, once,
#: from the ``scontrol show node`` that selected the idle nodes. ``Weight`` unset in the line is 1.
SLURM_SETTINGS = {"Gres": "Gres", "Features": "AvailableFeatures", "Weight": "Weight"}
#: A GRES's socket binding as ``scontrol`` appends it (``gpu:h100:8(S:0-1)``).
_GRES_SOCKETS = re.compile(r"\(S:[^)]*\)")


def judge(
    node: str, raw: str | bytes | Mapping[str, Any] | None, why_missing: str = ""
) -> NodeResult:
    """``node``'s outcome from its record; a corrupt record makes the node ``error``, not the run.

    ``raw`` None: the node handed nothing back (``not_checked`` with ``why_missing``).
    """
    if raw is None:
        return NodeResult(node, "not_checked", why_missing or "no result")
    try:
        rec = (
            node_record.from_dict(raw, source=f"{node}'s result")
            if isinstance(raw, Mapping)
            else node_record.from_json(raw, source=f"{node}'s result")
        )
    except InputError as exc:
        return NodeResult(node, "error", f"corrupt result: {exc}"[:500])
    if rec.node != node:
        return NodeResult(node, "error", f"corrupt result: names node {rec.node!r}")
    if rec.tier != "conformance":
        return NodeResult(node, "error", f"corrupt result: tier {rec.tier!r}, not conformance")
    failed = tuple(
        c for c in rec.checks if not c.shadow and c.status not in {Status.PASS, Status.SKIP}
    )
    why = ",".join(c.check for c in failed if c.status in {Status.FAIL, Status.ERROR})
    return NodeResult(node, rec.verdict, why, failed, rec.drift)


def firmware_of(raw: Mapping[str, Any]) -> dict[str, str]:
    """The firmware versions a record carries (empty when none or unreadable)."""
    for check in raw.get("checks", []):
        if isinstance(check, Mapping) and check.get("check") == FIRMWARE_CHECK:
            try:
                data = json.loads(str(check.get("measured") or "{}"))
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    return {}


def firmware_outliers(
    firmware: Mapping[str, Mapping[str, str]], node_types: Mapping[str, str]
) -> dict[str, list[Drift]]:
    """Nodes whose firmware differs from the most common version of their node type.

    Only a clear majority is a reference: at least three nodes report the component and one
    version is held by more than half of them; otherwise nobody is called odd.
    """
    by_type: dict[tuple[str, str], dict[str, str]] = {}
    for node, versions in firmware.items():
        for component, version in versions.items():
            by_type.setdefault((node_types.get(node, ""), component), {})[node] = version
    out: dict[str, list[Drift]] = {}
    for (_, component), seen in sorted(by_type.items()):
        if len(seen) < 3:
            continue
        common, count = Counter(seen.values()).most_common(1)[0]
        if count * 2 <= len(seen):
            continue
        for node, version in sorted(seen.items()):
            if version != common:
                out.setdefault(node, []).append(Drift("firmware", component, common, version))
    return out


def desired_slurm(nodes_conf: str) -> dict[str, dict[str, str]]:
    """Each node's :data:`SLURM_SETTINGS` from the ``NodeName=`` lines of a generated
    ``nodes.conf``."""
    out: dict[str, dict[str, str]] = {}
    for raw in nodes_conf.splitlines():
        fields = dict(p.split("=", 1) for p in raw.split("#", 1)[0].split() if "=" in p)
        names = fields.get("NodeName", "")
        if not names or names == "DEFAULT":
            continue
        wanted = {"Weight": "1"} | {k: fields[k] for k in SLURM_SETTINGS if k in fields}
        for node in hostlist.expand_hostlist(names):
            out[node] = wanted
    return out


def _slurm_value(key: str, value: str) -> str:
    value = "" if value in {"(null)", "(none)"} else value
    if key == "Gres":
        value = _GRES_SOCKETS.sub("", value)
    if key in {"Gres", "Features"}:
        return ",".join(sorted(v for v in value.split(",") if v))
    return value


def slurm_drift(
    desired: Mapping[str, Mapping[str, str]], states: Mapping[str, SlurmNode]
) -> dict[str, list[Drift]]:
    """Nodes whose settings in Slurm differ from the generated ``nodes.conf`` (someone ran
    ``scontrol update``, or edited the controller's file and reconfigured)."""
    out: dict[str, list[Drift]] = {}
    for node, wanted in sorted(desired.items()):
        state = states.get(node)
        if state is None:
            continue
        for key, want in sorted(wanted.items()):
            got = state.fields.get(SLURM_SETTINGS[key], "")
            if _slurm_value(key, got) != _slurm_value(key, want):
                out.setdefault(node, []).append(Drift("slurm", key, want, got or "unset"))
    return out


def with_drift(result: NodeResult, items: list[Drift]) -> NodeResult:
    """``result`` with drift the controller found added (firmware, Slurm): a passing node then
    fails ``conformance.drift``."""
    if not items or result.outcome in {"not_checked", "error"}:
        return result
    failed = result.failed
    if not any(c.check == DRIFT_CHECK and c.status is Status.FAIL for c in failed):
        drift_failed = failed_check(result.node, DRIFT_CHECK, Status.FAIL, "quarantine")
        failed = (*[c for c in failed if c.check != DRIFT_CHECK], drift_failed)
    why = ",".join(dict.fromkeys([*(result.why.split(",") if result.why else []), DRIFT_CHECK]))
    return NodeResult(result.node, "fail", why, failed, (*result.drift, *items))


def verdict(result: NodeResult) -> NodeVerdict | None:
    """The admission verdict of a checked node; None for one not checked (nothing to decide).

    A corrupt result is ``hold`` (an error never drains), a failure ``quarantine`` with the
    failed checks and their actions, a pass ``admit`` (resumes only gpuforge's own drains).
    """
    if result.outcome == "not_checked":
        return None
    if result.outcome == "error" and not result.failed:
        return decide(
            result.node,
            [CheckResult(result.node, "conformance.result", Status.ERROR, message=result.why)],
        )
    checks = list(result.failed)
    if not checks:
        checks = [CheckResult(result.node, DRIFT_CHECK, Status.PASS)]
    return node_record.node_verdict(result.node, checks)
