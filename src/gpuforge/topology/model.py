"""The topology spec: frozen pydantic models, one YAML file per cluster.

Field-level rules live here; rules that relate several fields (subnets that must hold every
node, phases that must cover every GPU node, racks that must hold their power) live in
``gpuforge.topology.check`` so that each problem can name its own field path.
"""

from __future__ import annotations

import re
import string
from ipaddress import IPv4Address, IPv4Network
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

Role = Literal["controller", "login", "gpu", "storage"]
FabricKind = Literal["infiniband", "roce"]

_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}([-~+][0-9A-Za-z.]+)?$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DOMAIN_RE = re.compile(r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")

Name = Annotated[str, Field(pattern=_NAME_RE.pattern, description="lower-case name: a-z, 0-9, -")]
# The patterns are whole-string matches (``fullmatch`` in Python, pydantic's ``$`` is the end of
# the text): ``re.match`` with ``$`` would take a value ending in a newline ("570.133.20\n").

IFNAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14}$"
"""A Linux interface name: at most 15 characters (IFNAMSIZ), no whitespace, ``/``, ``:`` or
shell characters, and not ``.`` or ``..``."""
Ifname = Annotated[str, Field(pattern=IFNAME_PATTERN, description="Linux interface name")]

MAX_MEMORY_MB = 1 << 40
"""RealMemory (MiB) of one node: Slurm's field is 64-bit; 2^40 MiB is an exbibyte."""
MAX_INDEX = 999_999_999
"""Largest node index: nine digits, within a 32-bit integer, which Slurm's hostlists take."""
MAX_DOMAIN = 253 - 2
"""Characters of the domain: an FQDN is at most 253, and a host label and a dot come first."""

RESERVED_RANGES = (
    (IPv4Network("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (IPv4Network("127.0.0.0/8"), "loopback (127.0.0.0/8)"),
    (IPv4Network("169.254.0.0/16"), "link-local (169.254.0.0/16)"),
    (IPv4Network("224.0.0.0/4"), "multicast (224.0.0.0/4)"),
    (IPv4Network("240.0.0.0/4"), "reserved (240.0.0.0/4, with the broadcast 255.255.255.255)"),
)
"""Ranges no node address may come from (RFC 6890)."""


class _Spec(BaseModel):
    # allow_inf_nan: a float of inf or nan would be written as the non-JSON tokens Infinity
    # and NaN into topology.json, and compares false with every bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Nic(_Spec):
    """A compute NIC: one rail of the compute fabric."""

    device: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,63}$", description="RDMA device, e.g. mlx5_0 (63 at most)"
    )
    netdev: Ifname = Field(description="Linux netdev, e.g. ib0 or ens1f0np0")
    rate_gbps: Literal[100, 200, 400, 800] = Field(description="Link rate in Gb/s")


class NodeType(_Spec):
    """Hardware of one kind of node."""

    gpu_model: str | None = Field(
        default=None, description="GPU model, e.g. H100-SXM-80GB, H200-SXM-141GB, B200, GB200"
    )
    gpus: int = Field(default=0, ge=0, le=16, description="GPUs per node")
    gres_type: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9_]+$",
        description="Slurm GRES type; default: the GPU model's first word, lower-case (h100)",
    )
    nvlink_domain: int = Field(
        default=0, ge=0, le=576, description="GPUs per NVLink domain: 8 for HGX, 72 for NVL72"
    )
    nvswitch: bool = Field(default=False, description="NVSwitch present (Fabric Manager runs)")
    pcie_gen: int | None = Field(
        default=None,
        ge=1,
        le=6,
        description="PCIe generation every GPU link must train to; default: the GPU model's",
    )
    pcie_width: Literal[1, 2, 4, 8, 16] | None = Field(
        default=None, description="PCIe lanes every GPU link must train to; default: 16"
    )
    sockets: int = Field(ge=1, le=8)
    cores_per_socket: int = Field(ge=1, le=512)
    threads_per_core: int = Field(ge=1, le=8)
    memory_mb: int = Field(
        ge=1024, le=MAX_MEMORY_MB, description="Memory Slurm may schedule (RealMemory), MiB"
    )
    power_kw: float = Field(gt=0, le=200, description="Peak power draw of one node, kW")
    rails: tuple[Nic, ...] = Field(default=(), description="Compute NICs, in rail order")
    management_nic: Ifname | None = None
    storage_nics: tuple[Ifname, ...] = Field(default=(), max_length=16)

    @model_validator(mode="after")
    def _gpu_fields(self) -> NodeType:
        if self.gpus and not self.gpu_model:
            raise ValueError("gpu_model is required when gpus > 0")
        if self.gpus and self.nvlink_domain and self.nvlink_domain % self.gpus:
            raise ValueError(
                f"nvlink_domain ({self.nvlink_domain}) must be a multiple of gpus ({self.gpus})"
            )
        return self

    @property
    def slurm_gres_type(self) -> str:
        if self.gres_type:
            return self.gres_type
        return (self.gpu_model or "gpu").split("-")[0].lower()

    @property
    def nvlink_nodes(self) -> int:
        """Nodes per NVLink domain (1 for HGX boards, 18 for an NVL72 rack)."""
        if not self.gpus or self.nvlink_domain <= self.gpus:
            return 1
        return self.nvlink_domain // self.gpus


class NodeGroup(_Spec):
    """A group of identical nodes with one role."""

    name: Name
    role: Role
    count: int = Field(ge=1, le=200_000)
    hostname: str = Field(description="Pattern with {index}, e.g. gpu{index:05d}")
    node_type: str
    first_index: int = Field(
        default=1, ge=0, le=MAX_INDEX, description="Index of the group's first node"
    )

    @field_validator("first_index")
    @classmethod
    def _last_index(cls, value: int, info: ValidationInfo) -> int:
        count = info.data.get("count")
        if isinstance(count, int) and value + count - 1 > MAX_INDEX:
            raise ValueError(
                f"the group's last index {value + count - 1} is above {MAX_INDEX}: Slurm's "
                "hostlists and node names take at most nine digits"
            )
        return value

    @field_validator("hostname")
    @classmethod
    def _pattern(cls, value: str) -> str:
        if "{index" not in value:
            raise ValueError("hostname pattern must contain {index}, e.g. gpu{index:05d}")
        if len(value) > 63:
            raise ValueError("hostname pattern is longer than a DNS label (63 characters)")
        try:
            # A width in the format spec is checked before formatting: {index:0400000000d}
            # would build a 400 MB string.
            for _, field, spec, _ in string.Formatter().parse(value):
                # {index[0]} or {index.real}: str.format would index or look up attributes
                # of the int (TypeError, or any attribute's text), so the field is index alone.
                if field is not None and field != "index":
                    raise ValueError(f"only {{index}} may be formatted, not {{{field}}}")
                if spec and "{" in spec:  # {index:{index}}: a width that grows with the index
                    raise ValueError(f"the format of {{index:{spec}}} may not hold a field")
                if spec and any(int(w) > 63 for w in re.findall(r"\d+", spec)):
                    raise ValueError(f"width in {{index:{spec}}} is wider than a DNS label")
            sample = value.format(index=1)
        except (KeyError, ValueError, IndexError) as exc:
            raise ValueError(f"hostname pattern cannot be formatted: {exc}") from None
        if not _LABEL_RE.fullmatch(sample):
            raise ValueError(f"pattern gives {sample!r}, not a valid lower-case DNS label")
        return value


class Layout(_Spec):
    """Physical layout: racks and scalable units (SUs) of GPU nodes."""

    nodes_per_rack: int = Field(ge=1, le=128)
    racks_per_su: int = Field(ge=1, le=256)
    rack_power_kw: float = Field(gt=0, description="Usable power per rack, kW")
    racks: int | None = Field(
        default=None, ge=1, description="Racks available for GPU nodes (unlimited when absent)"
    )
    service_nodes_per_rack: int = Field(
        default=16, ge=1, description="Controller/login/storage nodes per service rack"
    )

    @property
    def nodes_per_su(self) -> int:
        return self.nodes_per_rack * self.racks_per_su


class Fabric(_Spec):
    """The compute (east-west) fabric. The number of tiers is derived, never given."""

    kind: FabricKind
    rails: int = Field(ge=1, le=16, description="Compute NICs per GPU node")
    rail_optimized: bool = Field(
        default=True, description="Rail r of every node of an SU goes to that SU's rail-r leaf"
    )
    radix: int = Field(ge=4, le=512, description="Ports per switch (QM9700: 64)")
    oversubscription: float = Field(
        default=1.0, ge=1.0, le=8.0, description="Leaf down:up bandwidth ratio; 1.0 = 1:1"
    )
    switch_model: str | None = Field(default=None, description="Informational, e.g. QM9700")


class Subnet(_Spec):
    """One subnet with its gateway/offset rule: node number i gets network + host_offset + i."""

    subnet: IPv4Network
    gateway: IPv4Address | None = Field(default=None, description="Default: first host address")
    host_offset: int = Field(default=10, ge=1, description="Address offset of the first node")

    @field_validator("subnet", "gateway", mode="before")
    @classmethod
    def _written_as_text(cls, value: object) -> object:
        # ipaddress also takes integers (and so booleans): 'subnet: 1' would be 0.0.0.1/32.
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{value!r} is not an address: write it as text, e.g. 10.0.0.0/24")
        return value

    @field_validator("subnet")
    @classmethod
    def _usable(cls, value: IPv4Network) -> IPv4Network:
        for reserved, what in RESERVED_RANGES:
            if value.overlaps(reserved):
                raise ValueError(f"{value} overlaps the {what} range: no node address may be there")
        return value


class Addressing(_Spec):
    """Address plan: management, BMC and one compute subnet per rail."""

    management: Subnet
    bmc: Subnet
    rails: tuple[Subnet, ...] = Field(description="One subnet per rail (IPoIB or RoCE)")


class Versions(_Spec):
    """Pinned software versions; each must be a quoted version string."""

    nvidia_driver: str
    cuda: str
    nccl: str
    dcgm: str
    slurm: str
    doca_ofed: str | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        if value is None:
            return value
        if not isinstance(value, str):
            raise ValueError(
                f"{value!r} is not a version: write it as a quoted string, e.g. '12.8.1'"
            )
        if not _VERSION_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a version (expected digits and dots, e.g. 12.8.1)")
        return value


class Phase(_Spec):
    """A rollout phase; select its GPU nodes with exactly one of count, sus, hosts or rest.

    ``count``, ``sus`` and ``rest`` take only nodes that no earlier phase took (a canary, then
    "the rest of SU 1"); ``hosts`` names nodes explicitly and must not overlap earlier phases.
    """

    name: Name
    count: int | None = Field(default=None, ge=1, description="The next N GPU nodes in order")
    sus: tuple[int, ...] | None = Field(default=None, description="Every GPU node of these SUs")
    hosts: str | None = Field(default=None, description="A Slurm hostlist, e.g. gpu[01-04]")
    rest: bool = Field(default=False, description="Every GPU node no earlier phase took")
    min_pass_fraction: float = Field(
        default=1.0, gt=0.0, le=1.0, description="Gate: fraction of its nodes that must pass"
    )

    @model_validator(mode="after")
    def _one_selector(self) -> Phase:
        given = [
            n
            for n, v in (("count", self.count), ("sus", self.sus), ("hosts", self.hosts))
            if v is not None
        ] + (["rest"] if self.rest else [])
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of count, sus, hosts, rest (got {', '.join(given) or 'none'})"
            )
        return self


class Rollout(_Spec):
    """Phases in order: a canary first, then waves; a phase starts only after the previous gate."""

    phases: tuple[Phase, ...] = Field(min_length=1)


_DURATION_RE = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")
Severity = Literal["critical", "warning", "info"]


def _duration(value: object) -> object:
    """A Prometheus duration (30s, 1m30s, 15d) above zero, written as text."""
    if not isinstance(value, str) or not value or not _DURATION_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a Prometheus duration such as 30s, 1m or 15d")
    if not any(ch in "123456789" for ch in value):
        raise ValueError(f"{value!r} must be longer than 0")
    return value


Duration = Annotated[str, BeforeValidator(_duration)]


class AlertRoute(_Spec):
    """How Alertmanager treats the alerts of one severity (docs/monitoring.md)."""

    severity: Severity
    group_wait: Duration = "30s"
    group_interval: Duration = "5m"
    repeat_interval: Duration = Field(default="4h", description="Resend a firing alert after")


class RemoteWrite(_Spec):
    """A long-term store Prometheus writes to (Thanos Receive, Mimir, VictoriaMetrics)."""

    name: Name
    url: str = Field(description="remote_write endpoint URL, http:// or https://")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+\S*", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value


def _default_routes() -> tuple[AlertRoute, ...]:
    return (
        AlertRoute(severity="critical", group_wait="10s", repeat_interval="1h"),
        AlertRoute(severity="warning"),
        AlertRoute(severity="info", repeat_interval="24h"),
    )


class Monitoring(_Spec):
    """Prometheus and Alertmanager built from the spec (docs/monitoring.md)."""

    servers: str | None = Field(
        default=None,
        description="Slurm hostlist of the Prometheus servers, one shard each; default: the "
        "controllers",
    )
    scrape_interval: Duration = "30s"
    evaluation_interval: Duration = "30s"
    retention: Duration = Field(default="15d", description="Local TSDB retention per server")
    routes: tuple[AlertRoute, ...] = Field(default_factory=_default_routes)
    remote_write: tuple[RemoteWrite, ...] = ()
    federation: bool = Field(
        default=False,
        description="Also render a global Prometheus config that federates the shards' "
        "recording rules",
    )

    @field_validator("routes")
    @classmethod
    def _one_route_per_severity(cls, value: tuple[AlertRoute, ...]) -> tuple[AlertRoute, ...]:
        seen = [r.severity for r in value]
        dup = sorted({s for s in seen if seen.count(s) > 1})
        if dup:
            raise ValueError(f"more than one route for severity {', '.join(dup)}")
        return value


class Upgrade(_Spec):
    """How many nodes a rolling upgrade takes out at once (docs/upgrades.md)."""

    max_per_leaf: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Units (a node, or a whole multi-node NVLink domain) out at once under one "
        "leaf switch; default: the whole leaf, so every leaf is entirely in service or entirely "
        "out and a job that needs a full leaf block still finds one",
    )
    max_fraction: float = Field(
        default=0.10,
        gt=0.0,
        le=1.0,
        description="Share of each partition's GPUs out at once: 0.10 keeps >= 90% schedulable",
    )


class Topology(_Spec):
    """A whole cluster. See docs/topology.md."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra={"title": "gpuforge topology spec"}
    )

    name: Name = Field(description="Cluster name")
    domain: str = Field(description="DNS domain, e.g. lab.gpuforge.test")
    node_types: dict[str, NodeType] = Field(min_length=1)
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1)
    layout: Layout
    fabric: Fabric
    addressing: Addressing
    versions: Versions
    rollout: Rollout
    monitoring: Monitoring = Field(default_factory=Monitoring)
    upgrade: Upgrade = Field(default_factory=Upgrade)

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        if not _DOMAIN_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a lower-case DNS domain")
        if len(value) > MAX_DOMAIN:
            raise ValueError(
                f"{len(value)} characters: with a host name, longer than an FQDN may be (253)"
            )
        return value

    @field_validator("node_types")
    @classmethod
    def _type_names(cls, value: dict[str, NodeType]) -> dict[str, NodeType]:
        for key in value:
            if not _NAME_RE.fullmatch(key):
                raise ValueError(f"node type name {key!r} must be lower-case a-z, 0-9, -")
        return value
