"""The /etc/hosts fragment derived from the cluster: management names of every node."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined

from gpuforge.topology.cluster import Cluster

_ENV = Environment(  # noqa: S701 - renders a hosts file, not HTML
    loader=PackageLoader("gpuforge.inventory", "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def etc_hosts(cluster: Cluster) -> str:
    """An /etc/hosts fragment: management and BMC names of every node."""
    return _ENV.get_template("hosts.j2").render(
        cluster=cluster.name, domain=cluster.domain, nodes=cluster.nodes
    )
