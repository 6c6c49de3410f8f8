"""``/etc/gpuforge/health.yaml``: the node checker's configuration and the node's expected shape.

The health role renders the file from the inventory (tag ``health_config``) and validates it with
``gpuforge-node.pyz config check`` before it replaces the old one, so a bad file never takes
effect. :func:`load` is strict: an unknown key, a wrong type or a bad value is an
:class:`~gpuforge.errors.InputError` naming the file, the line and the key path::

    /etc/gpuforge/health.yaml:31: checks.gpu.xid.fail_after: must be an integer >= 1

Every key but ``version`` and ``node`` has a default; docs/health.md ("Configuration") lists
them with the reason for each. Check names are the catalogue's stable names (``gpu.xid``, ...);
each check takes ``enabled`` (kill switch: a disabled check does not run), ``shadow`` (runs and
is recorded, never counts for the verdict and never asks for a drain), ``fail_after`` and
``pass_after`` (hysteresis) and its own thresholds.
"""

from __future__ import annotations

import hashlib
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuforge.errors import InputError
from gpuforge.validate import catalogue
from gpuforge.yamlbound import BoundedLoader

VERSION = 1
DEFAULT_PATH = Path("/etc/gpuforge/health.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/gpuforge/health")
#: Debian's prometheus-node-exporter reads ``*.prom`` files here (its ``--collector.textfile``).
DEFAULT_TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")

TIER_NAMES = ("passive", "prolog", "epilog")
#: Default time budget per tier, seconds. passive: slurmd kills HealthCheckProgram at 60 s and
#: runs it on every node at once, 10 s leaves room; prolog: a job waits for it (aws-parallelcluster
#: #6777: prologs that hang job start); epilog: DCGM ``-r 1`` takes ~30 s on 8 GPUs.
TIER_TIMEOUTS = {"passive": 10.0, "prolog": 2.0, "epilog": 60.0}
#: The most a tier's or the collector's timeout may be, seconds: beyond it a value is no budget
#: (``1e300`` overflows the clock arithmetic); slurmd's own limits are far below.
MAX_TIMEOUT_S = 3600.0

#: The IB port counters fabric.counters reads, and how much each may grow (the catalogue's).
COUNTER_NAMES = catalogue.COUNTER_NAMES
COUNTER_MAX = catalogue.COUNTER_MAX


@dataclass(frozen=True, slots=True)
class CheckDefaults:
    """The built-in setting of one check, and its own threshold keys with their defaults."""

    fail_after: int = 1
    pass_after: int = 1
    shadow: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)


#: Every check the node runs, with its default hysteresis and thresholds: the check catalogue's
#: (:mod:`gpuforge.validate.catalogue`; docs/health.md says why).
CHECKS: dict[str, CheckDefaults] = {
    name: CheckDefaults(s.fail_after, s.pass_after, s.shadow, dict(s.params))
    for name, s in catalogue.node_checks().items()
}

VERSION_KEYS = catalogue.VERSION_KEYS
#: A node's name as Slurm and DNS take it.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """Where records go: ``url`` + ``/v1/records``, with a timeout in seconds."""

    url: str
    timeout_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Rail:
    """One fabric rail of this node: an HCA port and its netdev."""

    device: str
    port: int = 1
    netdev: str | None = None
    rate_gbps: float | None = None
    mtu: int | None = None
    #: ``InfiniBand`` or ``Ethernet`` (RoCE): RoCE rails get the PFC check, IB rails the counters.
    link_layer: str = "InfiniBand"


@dataclass(frozen=True, slots=True)
class Expect:
    """The node's declared shape, from the topology spec via the inventory."""

    gpus: int | None = None
    gpu_model: str | None = None
    nvlink_links_per_gpu: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    rails: tuple[Rail, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    services: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckConfig:
    """One check's switches, hysteresis and thresholds (defaults merged in)."""

    name: str
    enabled: bool = True
    shadow: bool = False
    fail_after: int = 1
    pass_after: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """A loaded, validated health.yaml."""

    node: str
    version: int = VERSION
    collector: CollectorConfig | None = None
    sysfs_root: Path = Path("/sys")
    state_dir: Path = DEFAULT_STATE_DIR
    textfile_dir: Path = DEFAULT_TEXTFILE_DIR
    spool_max: int = 100
    expect: Expect = field(default_factory=Expect)
    tiers: Mapping[str, float] = field(default_factory=lambda: dict(TIER_TIMEOUTS))
    checks: Mapping[str, CheckConfig] = field(default_factory=dict)
    #: ``sha256:<hex>`` of the file's bytes: records name the config they were judged under.
    digest: str = ""
    path: Path | None = None

    def check(self, name: str) -> CheckConfig:
        """The setting of check ``name`` (the default when the file does not mention it)."""
        found = self.checks.get(name)
        if found is not None:
            return found
        d = CHECKS[name]
        return CheckConfig(name, True, d.shadow, d.fail_after, d.pass_after, dict(d.params))

    def timeout(self, tier: str) -> float:
        """The time budget of ``tier`` in seconds."""
        return self.tiers.get(tier, TIER_TIMEOUTS.get(tier, 10.0))


# --- loading -------------------------------------------------------------------------------------


#: health.yaml's size bound: the role renders a few KiB; PyYAML reads some 100 KiB/s, so this also
#: bounds the time a file takes to read (the topology spec's bound, for the same reason).
MAX_CONFIG_BYTES = 64 << 10


class _Lines(BoundedLoader):
    """The shared bounded safe loader (:mod:`gpuforge.yamlbound`): depth and alias limits."""

    hint = "a health.yaml has a few hundred"


def _key_lines(node: yaml.Node, path: str, out: dict[str, int], source: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = f"{path}.{key}" if path else key
            if key in seen:
                raise InputError(f"{source}:{key_node.start_mark.line + 1}: {sub}: duplicate key")
            seen.add(key)
            out[sub] = key_node.start_mark.line + 1
            _key_lines(value_node, sub, out, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            sub = f"{path}[{i}]"
            out[sub] = item.start_mark.line + 1
            _key_lines(item, sub, out, source)


class _Reader:
    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines

    def fail(self, path: str, why: str) -> InputError:
        probe = path
        while probe and probe not in self.lines:
            probe = probe.rpartition(".")[0]
        line = self.lines.get(probe)
        where = f"{self.source}:{line}" if line else self.source
        return InputError(f"{where}: {path or '(top level)'}: {why}")

    def mapping(self, value: object, path: str, known: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, "must be a mapping")
        for key in value:
            if not isinstance(key, str) or key not in known:
                raise self.fail(_join(path, str(key)), f"unknown key (known: {', '.join(known)})")
        return value

    def integer(
        self, data: Mapping[str, Any], key: str, path: str, default: int | None, *, minimum: int
    ) -> int | None:
        if key not in data:
            return default
        value = data[key]
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(_join(path, key), f"must be an integer >= {minimum}")
        return value

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        default: float | None,
        *,
        positive: bool,
        maximum: float | None = None,
    ) -> float | None:
        if key not in data:
            return default
        value = data[key]
        if value is None and default is None:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self.fail(_join(path, key), f"must be a number {'> 0' if positive else '>= 0'}")
        if maximum is not None and value > maximum:
            raise self.fail(_join(path, key), f"must be a number <= {maximum:g}")
        return float(value)

    def text(self, data: Mapping[str, Any], key: str, path: str, default: str | None) -> str | None:
        if key not in data:
            return default
        value = data[key]
        if value is None and default is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # a version written unquoted (12.4) is still the version
        if not isinstance(value, str) or not value.strip():
            raise self.fail(_join(path, key), "must be a non-empty string")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            # A CR LF in the collector URL, a NUL in a path, a newline in the node's name: no
            # tier can use them (a header, open(2), a record line).
            raise self.fail(_join(path, key), "must not hold control characters")
        return value

    def flag(self, data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(_join(path, key), "must be true or false")
        return value

    def seq(self, data: Mapping[str, Any], key: str, path: str) -> list[Any]:
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(_join(path, key), "must be a list")
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_TOP = (
    "version", "node", "collector", "sysfs_root", "state_dir", "textfile_dir", "spool_max",
    "expect", "tiers", "checks",
)  # fmt: skip
_EXPECT = (
    "gpus", "gpu_model", "nvlink_links_per_gpu", "pcie", "rails", "versions", "services",
)  # fmt: skip
_RAIL = ("device", "port", "netdev", "rate_gbps", "mtu", "link_layer")
_CHECK = ("enabled", "shadow", "fail_after", "pass_after")


def read_yaml(text: str, source: str) -> tuple[Any, _Reader]:
    """``text`` parsed, and a reader whose errors name ``source``, the line and the key.

    Bounded before it can cost time or memory: :data:`MAX_CONFIG_BYTES`, and the nesting and
    alias limits of :class:`~gpuforge.yamlbound.BoundedLoader`.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise InputError(f"{source}: larger than {MAX_CONFIG_BYTES >> 10} KiB: not a health.yaml")
    loader = None
    try:
        loader = _Lines(text)
        tree = loader.get_single_node()
        data = loader.construct_document(tree) if tree is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{source}{line}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {exc}") from None
    except (ValueError, IndexError, TypeError, OverflowError) as exc:
        # PyYAML's constructors fail this way on some tagged scalars (``!!int ''``).
        why = f"a value cannot be read ({type(exc).__name__}: {exc})"
        raise InputError(f"{source}: not valid YAML: {why}") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[str, int] = {}
    if tree is not None:
        _key_lines(tree, "", lines, source)
    return data, _Reader(source, lines)


def parse(text: str, source: str = "health.yaml") -> HealthConfig:
    """Validate health.yaml's ``text``; ``source`` names the file in errors."""
    data, r = read_yaml(text, source)
    if data is None:
        raise InputError(f"{source}: empty file (version and node are required)")
    top = r.mapping(data, "", _TOP)
    for key in ("version", "node"):
        if key not in top:
            raise r.fail(key, "missing (required)")
    if top["version"] != VERSION or isinstance(top["version"], bool):
        raise r.fail("version", f"must be {VERSION} (got {top['version']!r})")
    node = r.text(top, "node", "", None)
    assert node is not None  # noqa: S101 - presence checked above
    if not _NODE_NAME.fullmatch(node):
        raise r.fail("node", f"must be a host name: letters, digits, '.', '_', '-' (got {node!r})")
    spool_max = r.integer(top, "spool_max", "", 100, minimum=1)
    assert spool_max is not None  # noqa: S101 - has a default
    return HealthConfig(
        node=node,
        collector=_collector(r, top),
        sysfs_root=_path(r, top, "sysfs_root", Path("/sys")),
        state_dir=_path(r, top, "state_dir", DEFAULT_STATE_DIR),
        textfile_dir=_path(r, top, "textfile_dir", DEFAULT_TEXTFILE_DIR),
        spool_max=spool_max,
        expect=_expect(r, top.get("expect")),
        tiers=_tiers(r, top.get("tiers")),
        checks=_checks(r, top.get("checks")),
        digest="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
    )


def load(path: Path = DEFAULT_PATH) -> HealthConfig:
    """Read and validate the file at ``path`` (at most :data:`MAX_CONFIG_BYTES` are read)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES >> 10} KiB: not a health.yaml")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    config = parse(text, str(path))
    return _with_path(config, path)


def _with_path(config: HealthConfig, path: Path) -> HealthConfig:
    return replace(config, path=path)


def _path(r: _Reader, data: Mapping[str, Any], key: str, default: Path) -> Path:
    value = r.text(data, key, "", str(default))
    assert value is not None  # noqa: S101 - has a default
    if not value.startswith("/"):
        raise r.fail(key, f"must be an absolute path (got {value!r})")
    return Path(value)


def _collector(r: _Reader, top: Mapping[str, Any]) -> CollectorConfig | None:
    if top.get("collector") is None:
        return None
    d = r.mapping(top["collector"], "collector", ("url", "timeout_s"))
    url = r.text(d, "url", "collector", None)
    if url is None:
        raise r.fail("collector.url", "missing (required when collector is set)")
    if not url.startswith(("http://", "https://")):
        raise r.fail("collector.url", f"must be an http:// or https:// URL (got {url!r})")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of 0-65535
    except ValueError as exc:
        raise r.fail("collector.url", f"not a usable URL: {exc} (got {url!r})") from None
    if not parts.hostname or any(ch.isspace() for ch in url):
        raise r.fail("collector.url", f"must name a host, without spaces (got {url!r})")
    timeout = r.number(d, "timeout_s", "collector", 2.0, positive=True, maximum=MAX_TIMEOUT_S)
    assert timeout is not None  # noqa: S101 - has a default
    return CollectorConfig(url.rstrip("/"), timeout)


def _expect(r: _Reader, raw: object) -> Expect:
    d = r.mapping(raw, "expect", _EXPECT)
    pcie = r.mapping(d.get("pcie"), "expect.pcie", ("gen", "width"))
    versions = r.mapping(d.get("versions"), "expect.versions", VERSION_KEYS)
    pins: dict[str, str] = {}
    for key in versions:
        value = r.text(versions, key, "expect.versions", None)
        if value is not None:
            pins[key] = value
    services = []
    for i, item in enumerate(r.seq(d, "services", "expect")):
        if not isinstance(item, str) or not item.strip():
            raise r.fail(f"expect.services[{i}]", "must be a service name")
        services.append(item)
    return Expect(
        gpus=r.integer(d, "gpus", "expect", None, minimum=0),
        gpu_model=r.text(d, "gpu_model", "expect", None),
        nvlink_links_per_gpu=r.integer(d, "nvlink_links_per_gpu", "expect", None, minimum=0),
        pcie_gen=r.integer(pcie, "gen", "expect.pcie", None, minimum=1),
        pcie_width=r.integer(pcie, "width", "expect.pcie", None, minimum=1),
        rails=tuple(
            _rail(r, raw, f"expect.rails[{i}]") for i, raw in enumerate(r.seq(d, "rails", "expect"))
        ),
        versions=pins,
        services=tuple(services),
    )


def _rail(r: _Reader, raw: object, path: str) -> Rail:
    d = r.mapping(raw, path, _RAIL)
    if not d:
        raise r.fail(path, "must be a mapping with a device")
    device = r.text(d, "device", path, None)
    if device is None:
        raise r.fail(_join(path, "device"), "missing (required)")
    layer = r.text(d, "link_layer", path, "InfiniBand")
    if layer not in ("InfiniBand", "Ethernet"):
        raise r.fail(_join(path, "link_layer"), f"must be InfiniBand or Ethernet (got {layer!r})")
    port = r.integer(d, "port", path, 1, minimum=1)
    assert port is not None  # noqa: S101 - has a default
    return Rail(
        device=device,
        port=port,
        netdev=r.text(d, "netdev", path, None),
        rate_gbps=r.number(d, "rate_gbps", path, None, positive=True),
        mtu=r.integer(d, "mtu", path, None, minimum=256),
        link_layer=layer,
    )


def _tiers(r: _Reader, raw: object) -> dict[str, float]:
    d = r.mapping(raw, "tiers", TIER_NAMES)
    out = dict(TIER_TIMEOUTS)
    for name in d:
        tier = r.mapping(d[name], f"tiers.{name}", ("timeout_s",))
        value = r.number(
            tier,
            "timeout_s",
            f"tiers.{name}",
            TIER_TIMEOUTS[name],
            positive=True,
            maximum=MAX_TIMEOUT_S,
        )
        assert value is not None  # noqa: S101 - has a default
        out[name] = value
    return out


def _checks(r: _Reader, raw: object) -> dict[str, CheckConfig]:
    d = r.mapping(raw, "checks", tuple(CHECKS))
    out: dict[str, CheckConfig] = {}
    for name, base in CHECKS.items():
        path = f"checks.{name}"
        c = r.mapping(d.get(name), path, _CHECK + tuple(base.params))
        fail_after = r.integer(c, "fail_after", path, base.fail_after, minimum=1)
        pass_after = r.integer(c, "pass_after", path, base.pass_after, minimum=1)
        assert fail_after is not None and pass_after is not None  # noqa: S101 - defaults
        out[name] = CheckConfig(
            name=name,
            enabled=r.flag(c, "enabled", path, True),
            shadow=r.flag(c, "shadow", path, base.shadow),
            fail_after=fail_after,
            pass_after=pass_after,
            params=_params(r, c, path, base.params),
        )
    return out


def _params(
    r: _Reader, data: Mapping[str, Any], path: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, default in defaults.items():
        if isinstance(default, Mapping):
            sub = r.mapping(data.get(key), _join(path, key), tuple(default))
            out[key] = {
                k: r.integer(sub, k, _join(path, key), int(v), minimum=0)
                for k, v in default.items()
            }
        elif isinstance(default, int):
            out[key] = r.integer(data, key, path, default, minimum=1)
        else:
            out[key] = r.number(data, key, path, float(default), positive=True)
    return out
