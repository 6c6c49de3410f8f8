"""What the roles and the validators demand of a spec, checked when the spec is loaded.

The rules are not written here: the roles' input rules live in ``roles/_common/vars/spec_rules.yml``
(each role's preflight asserts them from that file), the GPU models the validators can judge in
the SKU catalogue (:mod:`gpuforge.topology.skus`, which the validators' floors read too). This
module reads both, so the spec check, the roles and the validators cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from gpuforge.errors import InputError
from gpuforge.resources import project_path
from gpuforge.topology.errors import Problem
from gpuforge.topology.model import Topology
from gpuforge.topology.skus import validated, validated_keys

RULES_FILE = ("roles", "_common", "vars", "spec_rules.yml")


@dataclass(frozen=True, slots=True)
class VersionRule:
    """A pinned version's form, as the role that installs it asserts."""

    variable: str
    pattern: re.Pattern[str]
    example: str


@dataclass(frozen=True, slots=True)
class SpecRules:
    """The rules of ``spec_rules.yml``."""

    versions: dict[str, VersionRule]
    slurm_min_version: str
    slurm_topology_plugin_since: dict[str, str]


@cache
def spec_rules() -> SpecRules:
    """Read the roles' rules file (once)."""
    path = project_path(*RULES_FILE)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))["__common_spec_rules"]
        versions = {
            field: VersionRule(str(v["variable"]), re.compile(str(v["pattern"])), str(v["example"]))
            for field, v in data["versions"].items()
        }
        return SpecRules(
            versions=versions,
            slurm_min_version=str(data["slurm_min_version"]),
            slurm_topology_plugin_since={
                str(k): str(v) for k, v in data["slurm_topology_plugin_since"].items()
            },
        )
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: the roles' spec rules cannot be read: {exc}") from None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def check_rules(topo: Topology, topology_plugin: str) -> list[Problem]:
    """Problems a role's preflight or a validator would find only after provisioning began."""
    rules = spec_rules()
    problems: list[Problem] = []
    for field, rule in rules.versions.items():
        value = getattr(topo.versions, field, None)
        if value is not None and not rule.pattern.fullmatch(value):
            problems.append(
                Problem(
                    f"versions.{field}",
                    f"{value!r} is not a form the roles accept for {rule.variable} "
                    f"(pattern {rule.pattern.pattern}, e.g. '{rule.example}')",
                )
            )
    slurm = _release(topo.versions.slurm)
    oldest = rules.slurm_min_version
    since = rules.slurm_topology_plugin_since.get(topology_plugin, oldest)
    if slurm < _release(oldest):
        problems.append(
            Problem("versions.slurm", f"Slurm {topo.versions.slurm} is older than {oldest}")
        )
    elif slurm < _release(since):
        problems.append(
            Problem(
                "versions.slurm",
                f"this spec needs Slurm's topology/{topology_plugin} plugin (NVLink domains span "
                f"nodes), which Slurm {topo.versions.slurm} lacks: it arrived in {since}",
            )
        )
    problems.extend(_gpu_models(topo))
    problems.extend(_compatibility(topo))
    return problems


def _compatibility(topo: Topology) -> list[Problem]:
    """Pins the compatibility matrix forbids together (gpuforge.topology.compat)."""
    from gpuforge.topology.compat import SPEC_FIELDS, judge, spec_pins  # noqa: PLC0415

    return [
        Problem(
            f"versions.{c.other if c.other in SPEC_FIELDS else c.subject}",
            c.message(),
        )
        for c in judge(spec_pins(topo.versions)).conflicts
    ]


def compat_warnings(topo: Topology) -> list[str]:
    """Pairs of pins the compatibility matrix has no row for (a warning, not a refusal)."""
    from gpuforge.topology.compat import judge, spec_pins  # noqa: PLC0415

    return [u.message() for u in judge(spec_pins(topo.versions)).unknown]


def _gpu_models(topo: Topology) -> list[Problem]:
    problems = []
    for name, kind in topo.node_types.items():
        if not kind.gpus or not kind.gpu_model:
            continue
        if validated(kind.gpu_model) is None:
            problems.append(
                Problem(
                    f"node_types.{name}.gpu_model",
                    f"no validation thresholds for {kind.gpu_model!r}: the validators could not "
                    f"judge these nodes (known: {', '.join(sorted(validated_keys()))})",
                )
            )
    return problems
