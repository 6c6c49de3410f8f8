"""The topology spec, its validation and its expansion into nodes, switches and links."""

from __future__ import annotations

from gpuforge.topology.cluster import Cluster, Link, Node, PhasePlan, RailPort, Switch
from gpuforge.topology.errors import Problem, SpecError
from gpuforge.topology.expand import expand
from gpuforge.topology.load import load_cluster, load_spec, parse_spec
from gpuforge.topology.model import Topology

__all__ = [
    "Cluster",
    "Link",
    "Node",
    "PhasePlan",
    "Problem",
    "RailPort",
    "SpecError",
    "Switch",
    "Topology",
    "expand",
    "load_cluster",
    "load_spec",
    "parse_spec",
]
