"""One cluster context per command, and the click options every command shares.

A command parses its options, builds one :class:`ClusterContext` (:func:`cluster_context`, or
:func:`spec_context` for the commands that take a topology SPEC), calls one function of its
package and prints. The context knows the cluster directory, the cluster's name, its views (the
inventory's :class:`~gpuforge.inventory.reader.ClusterView`, the health
:class:`~gpuforge.health.fleet.Fleet`; each read at most once, when first asked for), the paths
of its records (:attr:`ClusterContext.state`, built by :func:`state_paths` only) and how to reach
its Slurm and its admission record, and the host that runs its services
(:attr:`ClusterContext.services`, where the commands that read the history run:
:func:`gpuforge.cli.common.on_services_host`).

Cluster selection is one rule for every command: ``--inventory DIR`` (the cluster directory),
else ``--cluster NAME`` (or the positional CLUSTER of the commands that had one) meaning
``inventory/NAME``; never both. The cluster's name is the one its ``topology.json`` gives; a
command that reads only the state (``--cluster`` without an inventory) uses the name given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gpuforge.admission import Admission, AdmissionRecord, BreakerPolicy
from gpuforge.errors import InputError
from gpuforge.health.fleet import Fleet
from gpuforge.inventory.reader import ClusterView, InventoryDir, host_vars
from gpuforge.services import ServicesHost
from gpuforge.slurm.control import DEFAULT_TIMEOUT, SlurmClient
from gpuforge.state_paths import StatePaths

#: Where clusters' directories are found by name (``inventory/NAME``).
INVENTORY_ROOT = Path("inventory")


def state_paths(state_dir: Path, cluster: str) -> StatePaths:
    """The one place a command makes a cluster's state paths (:class:`StatePaths`)."""
    return StatePaths(Path(state_dir), cluster)


# -- the context ---------------------------------------------------------------------------------


@dataclass
class ClusterContext:
    """One cluster as a command sees it; built once per command."""

    name: str
    state: StatePaths
    #: The cluster directory (generated/ and site/); None for a command that reads state only.
    root: Path | None = None
    _view: ClusterView | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        """The cluster directory as given (not opened); InputError when the command has none."""
        if self.root is None:
            raise InputError(f"cluster {self.name}: give --inventory DIR (the cluster directory)")
        return self.root

    @property
    def inventory(self) -> InventoryDir:
        """The cluster directory; InputError when the command was given none."""
        return InventoryDir.open(self.path)

    @property
    def view(self) -> ClusterView:
        """``topology.json`` and the inventory's variables (one ``ansible-inventory`` run)."""
        if self._view is None:
            self._view = ClusterView.load(self.inventory)
        return self._view

    @cached_property
    def services(self) -> ServicesHost | None:
        """The host that runs the cluster's services (``gpuforge_services``); None: none."""
        return ServicesHost.of(self)

    @cached_property
    def fleet(self) -> Fleet:
        """The GPU nodes with their place, from ``topology.json`` (no inventory run)."""
        return Fleet.load(self.inventory.root)

    def slurm(self, via: str | None, *, default: str = "local") -> SlurmClient:
        """Slurm's commands: ``local`` on this machine, else over SSH on ``via``.

        ``via`` None takes ``default``: ``local``, or ``controller`` (the inventory's first
        controller). SSH uses the inventory's connection settings when there is an inventory.
        """
        if (via or default) == "controller":
            host = self.view.controller()
            return SlurmClient.over_ssh(host, self.view.hostvars(host))
        return slurm_client(via or default, self.root)

    def admission(
        self,
        slurm: SlurmClient,
        source: str,
        *,
        breaker: BreakerPolicy | None = None,
        shadow: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        state: StatePaths | None = None,
    ) -> Admission:
        """The cluster's :class:`Admission` as ``source`` (``state``: another record's place)."""
        record = AdmissionRecord((state or self.state).admission_db)
        return Admission(
            slurm, record, source=source, breaker=breaker, shadow=shadow, timeout=timeout
        )


def remote_host(via: str | None) -> str | None:
    """The host ``--via`` names, or None for this machine (``via`` None or ``local``)."""
    return None if via in (None, "local") else via


def slurm_client(via: str | None, inventory: Path | None) -> SlurmClient:
    """Slurm on this machine (``via`` None or ``local``), or on ``via`` over SSH.

    SSH uses the connection settings (ansible_host, ansible_user, key) the cluster directory
    ``inventory`` gives ``via``, when there is one.
    """
    host = remote_host(via)
    if host is None:
        return SlurmClient.local()
    if inventory is None:
        return SlurmClient.over_ssh(host)
    return SlurmClient.over_ssh(host, host_vars(inventory, host))


def cluster_root(cluster: str | None, inventory: Path | None) -> Path:
    """The cluster directory: ``--inventory DIR``, else ``inventory/CLUSTER``; exit 2 if none."""
    if cluster and inventory:
        raise InputError("give CLUSTER or --inventory, not both")
    if inventory is not None:
        return inventory
    if cluster:
        return INVENTORY_ROOT / cluster
    raise InputError("give CLUSTER (inventory/CLUSTER) or --inventory DIR")


def given_root(cluster: str | None, inventory: Path | None) -> Path | None:
    """The cluster directory the options name, or None (none given, both given, no such dir)."""
    if cluster and inventory:
        return None
    root = inventory if inventory is not None else INVENTORY_ROOT / cluster if cluster else None
    return root if root is not None and root.is_dir() else None


def cluster_context(
    cluster: str | None,
    inventory: Path | None,
    state_dir: Path,
    *,
    require_generated: bool = False,
    view: ClusterView | None = None,
) -> ClusterContext:
    """The context of the cluster the options name (module docstring).

    ``require_generated``: refuse (exit 2) a directory without ``generated/`` before anything
    is read or written. ``view``: one already loaded (``gpuforge validate``'s wiring).
    """
    root = cluster_root(cluster, inventory)
    if require_generated and not (root / "generated").is_dir():
        raise InputError(f"unknown cluster: {root} is not a cluster directory (no generated/)")
    name = _name_of(root, view)
    return ClusterContext(name, state_paths(state_dir, name), root, view)


def state_context(
    cluster: str | None, state_dir: Path, inventory: Path | None = None
) -> ClusterContext:
    """A command that reads or changes one cluster's state by name (``--cluster NAME``)."""
    if not cluster:
        raise InputError("give --cluster NAME: the cluster whose state under --state-dir to use")
    return ClusterContext(cluster, state_paths(state_dir, cluster), inventory)


def spec_context(name: str, inventory: Path | None, state_dir: Path) -> ClusterContext:
    """A command that takes a topology SPEC: the cluster SPEC names, ``inventory/<name>``."""
    root = InventoryDir.open(inventory or INVENTORY_ROOT / name).root
    return ClusterContext(name, state_paths(state_dir, name), root)


def _name_of(root: Path, view: ClusterView | None) -> str:
    if view is not None:
        return str(view.topology.get("name") or "cluster")
    return Fleet.load(root).name
