"""Fault file (YAML or JSON) → validated document → per-node simulator state.

The lab calls these on the host; everything here is stdlib-only, PyYAML is used when present.

Fault file::

    version: 1
    seed: 7                  # optional, noise seed
    faults:
      - {node: gpu001, kind: gpu_missing, gpu: 3}
      - {leaf: leaf-su01-r0, kind: slow_uplink, factor: 0.25}

``cluster_info`` (what the lab knows about the lab's nodes)::

    {"name": "lab",
     "fabric": {"kind": "infiniband", "rate_gbps": 400},
     "nodes": [{"hostname": "gpu001", "role": "gpu", "gpu_model": "H100-SXM-80GB", "gpus": 8,
                "nvswitch": true,
                "rails": [{"rail": 0, "device": "mlx5_0", "netdev": "ib0", "rate_gbps": 400,
                           "leaf": "leaf-su01-r0", "port": 1}]}]}
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .skus import resolve_sku
from .state import LOADED_MODULE, RUN_DIR

STATE_SCHEMA_VERSION = 1

_INT = "int"
_FLOAT = "float"
_STR = "str"
_INTLIST = "int|list[int]|'all'"

# kind → (scope, required params, optional params with defaults). Scope "node" faults name a
# node; "leaf" faults name a switch. Types are checked by _check_type.
FAULT_KINDS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "gpu_missing": ("node", {"gpu": _INT}, {}),
    "ecc_uncorrectable": ("node", {"gpu": _INT}, {"count": 2}),
    "row_remap_pending": ("node", {"gpu": _INT}, {}),
    "row_remap_failure": ("node", {"gpu": _INT}, {}),
    "xid": ("node", {"gpu": _INT, "code": _INT}, {"count": 1}),
    "nvlink_down": ("node", {"gpu": _INT}, {"links": "all"}),
    "throttle": ("node", {"gpu": _INT}, {"reason": "thermal"}),
    "hbm_degraded": ("node", {"gpu": _INT}, {"factor": 0.7}),
    "burn_faulty": ("node", {"gpu": _INT}, {}),
    "pcie_downtrained": ("node", {"gpu": _INT}, {"gen": 4, "width": 8}),
    "clocks_locked": ("node", {"gpu": _INT}, {"factor": 0.63}),
    "ib_port_down": ("node", {"rail": _INT}, {}),
    "ib_port_polling": ("node", {"rail": _INT}, {}),
    "ib_wrong_rate": ("node", {"rail": _INT}, {"rate_gbps": 200}),
    "link_flap": ("node", {"rail": _INT}, {"count": 3, "hours": 2}),
    "slow_nic": ("node", {"rail": _INT}, {"factor": 0.5}),
    "slow_uplink": ("leaf", {"leaf": _STR}, {"factor": 0.25}),
    "wrong_driver": ("node", {"version": _STR}, {}),
    "wrong_nccl": ("node", {"version": _STR}, {}),
    "missing_peermem": ("node", {}, {}),
    "fabricmanager_down": ("node", {}, {}),
    "ib_errors": ("node", {"rail": _INT}, {"counter": "symbol_error", "per_hour": 600}),
    "ecc_degrading": (
        "node",
        {"gpu": _INT},
        {"hours": 1, "peak_per_hour": 600, "rows": 6, "speedup": 1},
    ),
    "power_high": ("node", {}, {"load": 0.98}),
}
#: When a node fault goes away by itself: a GPU reset (``nvidia-smi -r``), a reboot, or never
#: (a part must be replaced; the fault stays until the fault file drops it).
CLEARS_ON = ("reset", "reboot", "never")
#: Default ``clears_on`` per kind: what resetting or rebooting a real node does to that fault.
#: Volatile ECC counts, pending remaps (a reset activates them), NVLink training and locked
#: clocks go with a GPU reset; a lost GPU (Xid 79), a hung GSP (Xid 119) and the fabric manager
#: need a reboot; hardware (a GPU off the bus, a remap failure, cables, ports, HBM) needs a hand.
DEFAULT_CLEARS_ON: dict[str, str] = {
    "gpu_missing": "never",
    "ecc_uncorrectable": "reset",
    "row_remap_pending": "reset",
    "row_remap_failure": "never",
    "xid": "reset",
    "nvlink_down": "reset",
    "throttle": "never",
    "hbm_degraded": "never",
    "burn_faulty": "never",
    "pcie_downtrained": "reboot",
    "clocks_locked": "reset",
    "ib_port_down": "never",
    "ib_port_polling": "never",
    "ib_wrong_rate": "never",
    "link_flap": "never",
    "slow_nic": "never",
    "wrong_driver": "never",
    "wrong_nccl": "never",
    "missing_peermem": "reboot",
    "fabricmanager_down": "reboot",
    "ib_errors": "never",
    "ecc_degrading": "never",
    "power_high": "never",
}
#: Xid codes whose default differs from the ``xid`` kind's: 79 (fallen off the bus) and 119
#: (GSP timeout) need a reboot, 64 (remap failure) is hardware.
XID_CLEARS_ON: dict[int, str] = {79: "reboot", 119: "reboot", 64: "never"}
#: IB port counters an ``ib_errors`` fault can grow (the kernel's sysfs counter file names).
IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
_OPTIONAL_TYPES: dict[str, str] = {
    "count": _INT,
    "links": _INTLIST,
    "reason": _STR,
    "factor": _FLOAT,
    "gen": _INT,
    "width": _INT,
    "rate_gbps": _INT,
    "node": _STR,
    "hours": _INT,
    "counter": _STR,
    "per_hour": _INT,
    "peak_per_hour": _INT,
    "rows": _INT,
    "speedup": _INT,
    "load": _FLOAT,
    "clears_on": _STR,
}
THROTTLE_REASONS = ("thermal", "sw_thermal", "power", "power_brake")
# Xid codes the simulator knows the driver's message for (open-gpu-kernel-modules nverror.h).
XID_MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f1a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008, engmask 00000101, intr 10000000",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 3, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row.",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
}


def default_clears_on(fault: Mapping[str, Any]) -> str:
    """What clears ``fault`` when the fault file does not say (``DEFAULT_CLEARS_ON``)."""
    if fault["kind"] == "xid":
        return XID_CLEARS_ON.get(int(fault.get("code", 0)), "reset")
    return DEFAULT_CLEARS_ON.get(str(fault["kind"]), "never")


class FaultFileError(ValueError):
    """The fault file is unreadable or does not follow the schema; the message says where."""


def _check_type(where: str, name: str, value: Any, kind: str) -> None:
    ok: bool
    if kind == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif kind == _FLOAT:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1
    elif kind == _STR:
        ok = isinstance(value, str) and bool(value)
    else:  # _INTLIST
        ok = value == "all" or (
            isinstance(value, list)
            and bool(value)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )
    if not ok:
        expect = {
            _INT: "a non-negative integer",
            _FLOAT: "a number in (0, 1]",
            _STR: "a non-empty string",
        }.get(kind, "'all' or a list of link numbers")
        raise FaultFileError(f"{where}: '{name}' must be {expect}, got {value!r}")


def validate_fault_doc(doc: Any, source: str = "<fault file>") -> dict[str, Any]:  # noqa: PLR0912, PLR0915
    """Check a parsed fault document and return it normalised (defaults filled in).

    Raises:
        FaultFileError: with the file, the fault's index and the offending key.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise FaultFileError(f"{source}: top level must be a mapping with 'faults'")
    unknown = set(doc) - {"version", "seed", "faults", "time_scale"}
    if unknown:
        raise FaultFileError(f"{source}: unknown top-level key(s): {', '.join(sorted(unknown))}")
    version = doc.get("version", 1)
    if version != 1:
        raise FaultFileError(f"{source}: version: only 1 is supported, got {version!r}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FaultFileError(f"{source}: seed: must be an integer, got {seed!r}")
    time_scale = doc.get("time_scale", 0.1)
    if not isinstance(time_scale, int | float) or isinstance(time_scale, bool) or time_scale < 0:
        raise FaultFileError(f"{source}: time_scale: must be a number >= 0, got {time_scale!r}")
    raw = doc.get("faults") or []
    if not isinstance(raw, list):
        raise FaultFileError(f"{source}: faults: must be a list")
    faults: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"{source}: faults[{i}]"
        if not isinstance(item, Mapping):
            raise FaultFileError(f"{where}: must be a mapping with 'kind'")
        kind = item.get("kind")
        if kind not in FAULT_KINDS:
            raise FaultFileError(
                f"{where}: kind: unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}"
            )
        scope, required, optional = FAULT_KINDS[kind]
        fault: dict[str, Any] = {"kind": kind}
        if scope == "node":
            node = item.get("node")
            _check_type(where, "node", node, _STR)
            fault["node"] = node
        allowed = {"kind", "node", "note", *required, *optional}
        if scope == "node":
            allowed.add("clears_on")
        extra = set(item) - allowed
        if extra:
            raise FaultFileError(
                f"{where}: {kind} does not take {', '.join(sorted(extra))}; "
                f"it takes {', '.join(sorted(allowed - {'kind', 'note'}))}"
            )
        for name, typ in required.items():
            if name not in item:
                raise FaultFileError(f"{where}: {kind} needs '{name}'")
            _check_type(where, name, item[name], typ)
            fault[name] = item[name]
        for name, default in optional.items():
            value = item.get(name, default)
            _check_type(where, name, value, _OPTIONAL_TYPES[name])
            fault[name] = value
        if kind == "throttle" and fault["reason"] not in THROTTLE_REASONS:
            raise FaultFileError(
                f"{where}: reason must be one of {', '.join(THROTTLE_REASONS)}, "
                f"got {fault['reason']!r}"
            )
        if kind == "xid" and fault["code"] not in XID_MESSAGES:
            raise FaultFileError(
                f"{where}: code {fault['code']} has no simulated message; "
                f"known: {', '.join(str(c) for c in XID_MESSAGES)}"
            )
        if kind == "ib_errors" and fault["counter"] not in IB_ERROR_COUNTERS:
            raise FaultFileError(
                f"{where}: counter must be one of {', '.join(IB_ERROR_COUNTERS)}, "
                f"got {fault['counter']!r}"
            )
        if kind == "ecc_degrading" and (fault["hours"] < 1 or fault["speedup"] < 1):
            raise FaultFileError(f"{where}: hours and speedup must be >= 1")
        if scope == "node":
            clears = item.get("clears_on", default_clears_on(fault))
            if clears not in CLEARS_ON:
                raise FaultFileError(
                    f"{where}: clears_on must be one of {', '.join(CLEARS_ON)}, got {clears!r}"
                )
            fault["clears_on"] = clears
        if "note" in item:
            fault["note"] = str(item["note"])
        faults.append(fault)
    return {"version": 1, "seed": seed, "time_scale": float(time_scale), "faults": faults}


def load_fault_file(path: str | Path) -> dict[str, Any]:
    """Read and validate a fault file (YAML, or JSON when PyYAML is absent or the name ends .json).

    Raises:
        FaultFileError: unreadable file, bad syntax or a schema violation.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FaultFileError(f"{p}: cannot read fault file: {exc.strerror}") from exc
    doc: Any
    if p.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FaultFileError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    else:
        try:
            import yaml  # noqa: PLC0415 - optional on the host, absent on nodes
        except ImportError:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise FaultFileError(f"{p}: PyYAML is not installed; cannot read YAML") from exc
        else:
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                line = f":{mark.line + 1}" if mark is not None else ""
                raise FaultFileError(f"{p}{line}: invalid YAML: {exc}") from exc
    return validate_fault_doc(doc, str(p))


def _node_entry(node: Mapping[str, Any], kind: str) -> dict[str, Any]:
    hostname = str(node["hostname"])
    rails = []
    for r in node.get("rails", []):
        rails.append(
            {
                "rail": int(r["rail"]),
                "device": str(r.get("device", f"mlx5_{r['rail']}")),
                "netdev": str(r.get("netdev", f"ib{r['rail']}")),
                "rate_gbps": int(r.get("rate_gbps", 400)),
                "link_layer": str(
                    r.get("link_layer", "Ethernet" if kind == "roce" else "InfiniBand")
                ),
                "leaf": str(r.get("leaf", "")),
                "port": int(r.get("port", 1)),
            }
        )
    gpus = int(node.get("gpus", 0))
    model = node.get("gpu_model")
    entry: dict[str, Any] = {
        "hostname": hostname,
        "role": str(node.get("role", "gpu" if gpus else "other")),
        "gpu_model": None,
        "gpus": gpus,
        "nvswitch": bool(node.get("nvswitch", True)),
        "rails": rails,
        "faults": [],
    }
    if gpus and model:
        entry["gpu_model"] = resolve_sku(str(model)).key
    return entry


def fault_id(fault: Mapping[str, Any]) -> str:
    """A fault's identity: its content and the moment it was injected."""
    body = {k: v for k, v in fault.items() if k not in ("id", "note")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def _content(fault: Mapping[str, Any]) -> str:
    return json.dumps(
        {k: v for k, v in fault.items() if k not in ("id", "injected_at", "note")}, sort_keys=True
    )


def build_lab_state(
    fault_doc: Mapping[str, Any], cluster_info: Mapping[str, Any], now: float | None = None
) -> dict[str, Any]:
    """The part of the state that every node shares: all nodes, their faults, the fabric.

    Every node fault is stamped with ``injected_at`` (``now``, epoch seconds) and an ``id``:
    the simulator dates its kernel-log lines and grows its counters from that moment, and a
    GPU reset or reboot clears it by that id (``clears_on``).

    Raises:
        FaultFileError: a fault names a node, GPU, rail or leaf the lab does not have.
    """
    fabric = cluster_info.get("fabric", {})
    kind = str(fabric.get("kind", "infiniband"))
    nodes: dict[str, dict[str, Any]] = {}
    for node in cluster_info.get("nodes", []):
        try:
            entry = _node_entry(node, kind)
        except KeyError as exc:
            raise FaultFileError(f"cluster_info: node {node!r}: {exc}") from exc
        nodes[entry["hostname"]] = entry
    leaves = {r["leaf"] for n in nodes.values() for r in n["rails"] if r["leaf"]}
    slow_uplinks: list[dict[str, Any]] = []
    for i, fault in enumerate(fault_doc.get("faults", [])):
        where = f"faults[{i}] ({fault['kind']})"
        if FAULT_KINDS[fault["kind"]][0] == "leaf":
            if fault["leaf"] not in leaves:
                raise FaultFileError(
                    f"{where}: leaf {fault['leaf']!r} carries no rail of this lab; "
                    f"leaves: {', '.join(sorted(leaves)) or 'none'}"
                )
            slow_uplinks.append({"leaf": fault["leaf"], "factor": fault["factor"]})
            continue
        node = nodes.get(fault["node"])
        if node is None:
            raise FaultFileError(f"{where}: node {fault['node']!r} is not in this lab")
        if "gpu" in fault and fault["gpu"] >= node["gpus"]:
            raise FaultFileError(
                f"{where}: {fault['node']} has {node['gpus']} GPU(s); gpu {fault['gpu']} "
                "does not exist"
            )
        if "rail" in fault and fault["rail"] >= len(node["rails"]):
            raise FaultFileError(
                f"{where}: {fault['node']} has {len(node['rails'])} rail(s); "
                f"rail {fault['rail']} does not exist"
            )
        entry = {k: v for k, v in fault.items() if k != "node"}
        entry["injected_at"] = round(time.time() if now is None else now, 3)
        entry["id"] = fault_id(entry)
        node["faults"].append(entry)
    return {
        "schema": STATE_SCHEMA_VERSION,
        "cluster": str(cluster_info.get("name", "lab")),
        "seed": int(fault_doc.get("seed", 0)),
        "time_scale": float(fault_doc.get("time_scale", 0.1)),
        "fabric": {
            "kind": kind,
            "rate_gbps": int(fabric.get("rate_gbps", 400)),
            "slow_uplinks": slow_uplinks,
        },
        "nodes": nodes,
    }


def node_state(
    fault_doc: Mapping[str, Any],
    cluster_info: Mapping[str, Any],
    hostname: str,
    now: float | None = None,
) -> dict[str, Any]:
    """The JSON document to write to ``/var/lib/gpuforge-sim/state.json`` on ``hostname``.

    ``package_pins`` lists versions a ``wrong_driver``/``wrong_nccl`` fault asks the lab to
    install on this node instead of the cluster's pins (the lab or a role applies them).

    Raises:
        FaultFileError: the faults do not fit the lab, or ``hostname`` is not in it.
    """
    state = build_lab_state(fault_doc, cluster_info, now)
    if hostname not in state["nodes"]:
        raise FaultFileError(f"node_state: {hostname!r} is not a node of this lab")
    pins: dict[str, str] = {}
    for fault in state["nodes"][hostname]["faults"]:
        if fault["kind"] == "wrong_driver":
            pins["nvidia_driver_version"] = fault["version"]
        elif fault["kind"] == "wrong_nccl":
            pins["nccl_version"] = fault["version"]
    state["hostname"] = hostname
    state["package_pins"] = pins
    return state


def carry_over(state: dict[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keep the injection time and id of faults that ``previous`` (the node's last state) had.

    Loading a fault file again with a fault that is already there must not inject it again
    (a new Xid line, counters restarting); only new faults get the new time. Changes ``state``
    in place and returns it.
    """
    if not previous:
        return state
    old_nodes = previous.get("nodes") or {}
    for host, node in state.get("nodes", {}).items():
        before: dict[str, list[dict[str, Any]]] = {}
        for f in (old_nodes.get(host) or {}).get("faults") or []:
            if "injected_at" in f:
                before.setdefault(_content(f), []).append(f)
        for f in node.get("faults", []):
            same = before.get(_content(f))
            if same:
                old = same.pop(0)
                f["injected_at"] = old["injected_at"]
                f["id"] = old.get("id") or fault_id(f)
    return state


#: The packages a ``package_pins`` entry moves together: every one of them that is installed on
#: the node goes to the requested version (``{branch}`` is the driver branch, 570).
PIN_PACKAGES: dict[str, tuple[str, ...]] = {
    "nvidia_driver_version": (
        "nvidia-kernel-open-dkms",
        "nvidia-modprobe",
        "nvidia-persistenced",
        "nvidia-driver-cuda",
        "nvidia-driver",
        "cuda-drivers-{branch}",
        "cuda-drivers",
    ),
    "nccl_version": ("libnccl2", "libnccl-dev"),
}

_PIN_SCRIPT = """set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
args=""
for spec in {specs}; do
  pkg=${{spec%%=*}}; want=${{spec#*=}}
  dpkg-query -W -f='${{Status}}' "$pkg" 2>/dev/null | grep -q 'ok installed' || continue
  ver=$(apt-cache madison "$pkg" | awk -v v="$want-" 'index($3, v) == 1 {{ print $3; exit }}')
  [ -n "$ver" ] || {{ echo "the lab mirror has no $pkg $want" >&2; exit 3; }}
  args="$args $pkg=$ver"
done
[ -z "$args" ] && {{ echo "no pinned package installed yet: nothing to change"; exit 0; }}
apt-get install -y -q --allow-downgrades --allow-change-held-packages $args
apt-mark hold $(for a in $args; do echo "${{a%%=*}}"; done) >/dev/null
{reload}echo "installed:$args"
"""


def pin_install_script(pins: Mapping[str, str]) -> str:
    """A shell script that installs, on a provisioned lab node, the versions ``pins`` asks for.

    This is how ``wrong_driver``/``wrong_nccl`` take effect the way the real fault does: the
    node really has the other version installed (from the lab mirror, downgrades allowed,
    held like the role holds its pins), so dpkg, ``nvidia-smi`` and NCCL all report it. Only
    packages already installed move; on a node not yet provisioned the script changes nothing
    (the role then installs the cluster's pins). Running the roles again restores the pins.
    Empty when there is nothing to pin.
    """
    specs = []
    for key, version in sorted(pins.items()):
        branch = version.split(".", 1)[0]
        for pkg in PIN_PACKAGES.get(key, ()):
            specs.append(f"{pkg.format(branch=branch)}={version}")
    if not specs:
        return ""
    # The node runs that driver: its module is reloaded, so the next use loads the installed one
    # (an upgrade without a reboot would leave the old module and a version mismatch instead).
    reload = f"rm -f {RUN_DIR / LOADED_MODULE}\n" if "nvidia_driver_version" in pins else ""
    return _PIN_SCRIPT.format(specs=" ".join(specs), reload=reload)
