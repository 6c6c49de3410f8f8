"""Fault files for the hardware simulator, and the per-node state the lab writes from them.

The simulator (``lab/sim/gpuforge_sim``) owns the schema: :func:`load_fault_file` validates with
its ``faults.load_fault_file`` and :func:`node_states` builds each node's
``/var/lib/gpuforge-sim/state.json`` with its ``faults.node_state``.  The lab only provides what
the simulator needs to know about the cluster (:func:`cluster_info`) and the transport.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from gpuforge.errors import InputError

#: The fault document of a healthy lab.
NO_FAULTS: dict[str, Any] = {"version": 1, "faults": []}


def sim_faults() -> ModuleType:
    """The simulator's ``gpuforge_sim.faults`` module.

    ``gpuforge_sim`` is installed beside ``gpuforge``: a wheel carries it as a package of its own,
    and an editable install puts ``lab/sim`` on the path (pyproject.toml, hatch's
    ``dev-mode-dirs``).
    """
    try:
        return importlib.import_module("gpuforge_sim.faults")
    except ImportError as exc:
        raise InputError(f"the hardware simulator (gpuforge_sim) is not installed: {exc}") from exc


def load_fault_file(path: Any) -> dict[str, Any]:
    """Read and validate a fault file (YAML or JSON) with the simulator's own rules."""
    module = sim_faults()
    try:
        return dict(module.load_fault_file(path))
    except ValueError as exc:  # the simulator's FaultFileError
        raise InputError(str(exc)) from exc


def cluster_info(cluster: Any) -> dict[str, Any]:
    """What the simulator needs to know about an expanded topology (``Cluster``)."""
    spec = cluster.spec
    nodes = []
    for node in cluster.nodes:
        node_type = spec.node_types[node.node_type]
        rates = [nic.rate_gbps for nic in node_type.rails]
        nodes.append(
            {
                "hostname": node.hostname,
                "role": node.role,
                "gpu_model": node_type.gpu_model,
                "gpus": node_type.gpus,
                "nvswitch": node_type.nvswitch,
                "rails": [
                    {
                        "rail": port.rail,
                        "device": port.device,
                        "netdev": port.netdev,
                        "rate_gbps": rates[port.rail] if port.rail < len(rates) else 400,
                        "leaf": port.leaf,
                        "port": port.port,
                        "address": port.address,
                    }
                    for port in node.rails
                ],
            }
        )
    return {
        "name": cluster.name,
        "fabric": {"kind": spec.fabric.kind, "rate_gbps": cluster.rate_gbps},
        "nodes": nodes,
    }


def node_states(fault_doc: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each node's simulator state: the whole lab's faults and fabric, seen from that node."""
    module = sim_faults()
    try:
        return {
            str(node["hostname"]): dict(module.node_state(fault_doc, info, node["hostname"]))
            for node in info.get("nodes", [])
        }
    except ValueError as exc:
        raise InputError(str(exc)) from exc
