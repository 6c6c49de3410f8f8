"""The one way gpuforge reads a cluster's inventory: its two layers, as Ansible resolves them.

A cluster directory (``inventory/<cluster>/``) holds two inventory sources:

* ``generated/``: what ``gpuforge inventory generate`` renders from the topology spec (rewritten
  at will; marked by :data:`MARKER`), with the Slurm files, the hosts fragment and
  ``topology.json`` beside the inventory;
* ``site/``: what the site owns (connection settings, its package mirror, overrides of role
  defaults), created once from ``inventory/sample/site`` and never overwritten.

Ansible takes both with two ``-i`` options, ``generated`` first: for the same variable, the later
source wins, so the site overrides what was generated, and ``inventory_dir`` of every host is the
``generated/`` directory (the roles find ``slurm/`` and ``hosts`` there). Everything that needs
host variables asks :func:`list_inventory` or :func:`host_vars`, and the validators read the
typed :class:`ClusterView`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostlist

from gpuforge.errors import InputError, OperationError
from gpuforge.resources import project_path

GENERATED = "generated"
SITE = "site"
#: The file that says gpuforge wrote a ``generated/`` directory (and may replace it).
MARKER = ".gpuforge-generated"
#: Seconds ``ansible-inventory`` may take (a 12,500-host ``--list`` takes about 20 s).
LIST_TIMEOUT = 300.0
HOST_TIMEOUT = 120.0


@dataclass(frozen=True)
class InventoryDir:
    """A cluster directory: ``generated/`` and ``site/``, read in that order."""

    root: Path

    @property
    def generated(self) -> Path:
        """The layer gpuforge renders from the spec."""
        return self.root / GENERATED

    @property
    def site(self) -> Path:
        """The layer the site owns."""
        return self.root / SITE

    @property
    def sources(self) -> tuple[Path, ...]:
        """The inventory sources, in the order Ansible must read them (later wins)."""
        layers = [self.generated]
        if self.site.is_dir():
            layers.append(self.site)
        return tuple(p.resolve() for p in layers)

    @classmethod
    def open(cls, path: Path | str) -> InventoryDir:
        """The cluster directory at ``path``; InputError naming what is missing."""
        root = Path(path)
        if not root.is_dir():
            raise InputError(
                f"no inventory at {root}: run `gpuforge inventory generate SPEC -o {root}`"
            )
        inv = cls(root)
        if not (inv.generated / "hosts.yml").is_file():
            if (root / "hosts.yml").is_file():
                raise InputError(
                    f"{root} is an inventory of the old single-directory layout: run "
                    f"`gpuforge inventory generate SPEC -o DIR` and move its connection settings "
                    f"into DIR/{SITE}/ (docs/topology.md)"
                )
            raise InputError(
                f"{root} is not a cluster inventory directory (no {GENERATED}/hosts.yml): run "
                f"`gpuforge inventory generate SPEC -o {root}`"
            )
        return inv

    def ansible_args(self) -> list[str]:
        """``-i`` options for ``ansible``, ``ansible-playbook`` and ``ansible-inventory``."""
        return [arg for source in self.sources for arg in ("-i", str(source))]

    def ansible_env(self) -> dict[str, str]:
        """Environment for tools that take no ``-i`` (testinfra): ``ANSIBLE_INVENTORY``."""
        return {"ANSIBLE_INVENTORY": ",".join(str(s) for s in self.sources), **_config_env()}


def sample_site() -> Path:
    """The sample site layer new cluster directories start from."""
    return project_path("inventory", "sample", SITE)


def _config_env() -> dict[str, str]:
    # The generated layer holds non-inventory files (slurm/, hosts, topology.json) that only the
    # project's ansible.cfg tells Ansible to skip; an operator's own config takes precedence.
    if "ANSIBLE_CONFIG" in os.environ:
        return {}
    return {"ANSIBLE_CONFIG": str(project_path("ansible.cfg"))}


def _binary() -> str:
    # The one pinned beside gpuforge's interpreter, as the CLI does for every Ansible tool.
    beside = Path(sys.executable).with_name("ansible-inventory")
    return str(beside) if beside.is_file() else "ansible-inventory"


def _ansible_inventory(inv: InventoryDir, args: Sequence[str], timeout: float) -> Any:
    argv = [_binary(), *inv.ansible_args(), *args]
    env = {**os.environ, **_config_env(), "ANSIBLE_VERBOSITY": "0"}
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise OperationError(
            f"ansible-inventory {' '.join(args)} on {inv.root} timed out after {timeout:.0f}s"
        ) from exc
    except OSError as exc:
        raise OperationError(f"cannot run ansible-inventory (make setup): {exc}") from exc
    if proc.returncode != 0:
        raise InputError(
            f"ansible-inventory {' '.join(args)} failed on {inv.root}: {proc.stderr.strip()[-500:]}"
        )
    try:
        return json.loads(proc.stdout)
    except ValueError as exc:
        raise OperationError(f"ansible-inventory printed no JSON for {inv.root}: {exc}") from exc


def list_inventory(path: Path | InventoryDir, *, timeout: float = LIST_TIMEOUT) -> dict[str, Any]:
    """``ansible-inventory --list`` over both layers: groups and merged host variables."""
    inv = path if isinstance(path, InventoryDir) else InventoryDir.open(path)
    return dict(_ansible_inventory(inv, ["--list"], timeout))


def host_vars(
    path: Path | InventoryDir, host: str, *, timeout: float = HOST_TIMEOUT
) -> dict[str, Any]:
    """One host's variables as Ansible resolves them from both layers."""
    inv = path if isinstance(path, InventoryDir) else InventoryDir.open(path)
    return dict(_ansible_inventory(inv, ["--host", host], timeout))


_RAIL_FIELDS = ("rail", "device", "netdev", "address", "leaf", "port")


@dataclass(frozen=True)
class ClusterView:
    """What validation reads from a cluster directory: ``topology.json`` and host variables."""

    inventory_dir: InventoryDir
    topology: Mapping[str, Any]
    inventory: Mapping[str, Any]  # ``ansible-inventory --list`` output

    @classmethod
    def load(
        cls,
        path: Path | InventoryDir,
        listing: Callable[[InventoryDir], Mapping[str, Any]] = list_inventory,
    ) -> ClusterView:
        """Read ``generated/topology.json`` and both layers' variables; InputError if unusable."""
        inv = path if isinstance(path, InventoryDir) else InventoryDir.open(path)
        topo_file = inv.generated / "topology.json"
        if not topo_file.is_file():
            raise InputError(f"{inv.generated} is not a gpuforge inventory (no topology.json)")
        try:
            topology = json.loads(topo_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{topo_file}: {exc}") from exc
        return cls(inv, topology, listing(inv))

    @property
    def path(self) -> Path:
        """The cluster directory."""
        return self.inventory_dir.root

    @property
    def gpu_nodes(self) -> list[str]:
        """GPU nodes in cluster order."""
        return [n["hostname"] for n in self.topology.get("nodes", []) if n.get("role") == "gpu"]

    def node(self, name: str) -> Mapping[str, Any]:
        """The topology record of ``name``."""
        for n in self.topology.get("nodes", []):
            if n["hostname"] == name:
                return dict(n)
        raise InputError(f"{name} is not in {self.inventory_dir.generated}/topology.json")

    def hostvars(self, name: str) -> dict[str, Any]:
        """Merged variables of ``name`` (empty when the inventory listing has none)."""
        meta = self.inventory.get("_meta", {}).get("hostvars", {})
        return dict(meta.get(name, {}))

    def all_hostvars(self) -> dict[str, dict[str, Any]]:
        """Merged variables of every host."""
        meta = self.inventory.get("_meta", {}).get("hostvars", {})
        return {host: dict(values) for host, values in meta.items()}

    def select(self, *, limit: str | None = None, phase: int | None = None) -> list[str]:
        """The GPU nodes to validate: a hostlist, a phase, or (neither) every GPU node."""
        gpu = self.gpu_nodes
        if limit:
            try:
                wanted = hostlist.expand_hostlist(limit)
            except hostlist.BadHostlist as exc:
                raise InputError(f"bad --limit {limit!r}: {exc}") from exc
            unknown = sorted(set(wanted) - set(gpu))
            if unknown:
                raise InputError(f"not GPU nodes of this inventory: {', '.join(unknown[:10])}")
            return [n for n in gpu if n in set(wanted)]
        if phase is not None:
            chosen = [n for n in gpu if int(self.node(n).get("phase", 0)) == phase]
            if not chosen:
                raise InputError(f"phase {phase} has no GPU nodes")
            return chosen
        return gpu

    def controller(self) -> str:
        """The first Slurm controller."""
        ctl = self.inventory.get("slurm_controllers", {}).get("hosts") or [
            n["hostname"] for n in self.topology.get("nodes", []) if n.get("role") == "controller"
        ]
        if not ctl:
            raise InputError("no Slurm controller in the inventory")
        return str(ctl[0])

    def rails(self, name: str) -> list[dict[str, Any]]:
        """``[{rail, device, netdev, address, leaf, port}, ...]`` of ``name``."""
        fields = self.topology.get("rail_fields") or _RAIL_FIELDS
        return [dict(zip(fields, row, strict=False)) for row in self.node(name).get("rails", [])]

    def placement(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Rack and SU of every node, for the heat map."""
        return {n: {"rack": self.node(n).get("rack"), "su": self.node(n).get("su")} for n in names}

    def node_type(self, name: str) -> dict[str, Any]:
        """``gpu_node_type`` of ``name`` from the inventory."""
        return dict(self.hostvars(name).get("gpu_node_type") or {})

    @property
    def rate_gbps(self) -> float:
        """The fabric's port rate."""
        return float(self.topology.get("fabric", {}).get("rate_gbps") or 400)


_ANSIBLE_RANGE = re.compile(r"\[(\d+):(\d+)\]")


@dataclass(frozen=True)
class GeneratedHosts:
    """The generated layer's ``hosts.yml`` as data: host variables and group members."""

    hostvars: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]


def read_generated_hosts(path: Path | InventoryDir) -> GeneratedHosts:
    """Read ``generated/hosts.yml`` without Ansible (it is JSON; group ranges are expanded).

    A shard's inventory is cut from this (:mod:`gpuforge.execution.shards`): parsing the file
    is milliseconds where ``ansible-inventory --list`` of a 12,500-host fleet is 20 s.
    """
    inv = path if isinstance(path, InventoryDir) else InventoryDir.open(path)
    source = inv.generated / "hosts.yml"
    try:
        data = json.loads(source.read_text(encoding="utf-8"))["all"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{source}: not a hosts.yml gpuforge generated ({exc})") from None
    hostvars = {str(h): dict(v or {}) for h, v in (data.get("hosts") or {}).items()}
    groups: dict[str, list[str]] = {}
    for name, group in (data.get("children") or {}).items():
        members: list[str] = []
        for pattern in (group or {}).get("hosts") or {}:
            members.extend(hostlist.expand_hostlist(_ANSIBLE_RANGE.sub(r"[\1-\2]", pattern)))
        groups[str(name)] = members
    return GeneratedHosts(hostvars, groups)
