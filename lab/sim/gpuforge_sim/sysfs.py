"""A sysfs-shaped tree of the node's IB ports, for readers of ``/sys/class/infiniband``.

A container cannot add to ``/sys``, so ``gpuforge-sim-sysfs`` keeps a tree under
``/var/lib/gpuforge-sim/sys`` (``GPUFORGE_SIM_SYSFS``) with the kernel's files and formats::

    class/infiniband/<dev>/{board_id,fw_ver,hca_type,node_guid,sys_image_guid}
    class/infiniband/<dev>/ports/1/{state,phys_state,rate,link_layer,lid,sm_lid,cap_mask}
    class/infiniband/<dev>/ports/1/counters/{symbol_error,link_downed,port_rcv_errors,...}
    module/nvidia/version   (a link to this boot's simulated module, state.loaded_module_path)

and links every other entry to the real one (``devices`` → ``/sys/devices``, ``class/net`` →
``/sys/class/net``, ...), so node_exporter can take the whole tree as ``--path.sysfs`` and its
other collectors still read the real sysfs. Files are replaced atomically (write + rename) every
``--every`` seconds by the ``gpuforge-sim-sysfs`` service: a ticker rather than refresh-on-read,
because node_exporter and the health checker read the files directly, with no hook to run code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .counters import port_counters
from .ib import CA_TYPE, FW, _port
from .state import NodeView, SimError, load_lab, loaded_module_path

ENV_ROOT = "GPUFORGE_SIM_SYSFS"
DEFAULT_ROOT = Path("/var/lib/gpuforge-sim/sys")
REAL_SYS = Path("/sys")
#: state file text by port state (include/rdma/ib_verbs.h enum ib_port_state, sysfs.c).
STATE_TEXT = {"Active": "4: ACTIVE", "Down": "1: DOWN"}
PHYS_TEXT = {"LinkUp": "5: LinkUp", "Polling": "2: Polling", "Disabled": "3: Disabled"}
#: rate file: "<Gb/s> Gb/sec (<width>X <speed>)" as drivers/infiniband/core/sysfs.c prints it.
RATE_TEXT = {
    400: "400 Gb/sec (4X NDR)",
    200: "200 Gb/sec (4X HDR)",
    100: "100 Gb/sec (4X EDR)",
    50: "50 Gb/sec (2X HDR)",
    40: "40 Gb/sec (4X QDR)",
    10: "10 Gb/sec (4X SDR)",
}


def root() -> Path:
    return Path(os.environ.get(ENV_ROOT) or DEFAULT_ROOT)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() or path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _link_real_sysfs(top: Path, real: Path) -> None:
    """Every entry of the real sysfs, as a link, beside the simulated ``class/infiniband``
    and ``module/nvidia``."""
    if not real.is_dir():
        return
    for entry in real.iterdir():
        if entry.name not in ("class", "module"):
            _link(top / entry.name, entry)
    modules = top / "module"
    if modules.is_symlink():  # a tree written before module/nvidia was simulated
        modules.unlink()
    # This boot's simulated nvidia module (its version file exists once the module is loaded).
    _link(modules / "nvidia", loaded_module_path().parent)
    if (real / "module").is_dir():
        for entry in (real / "module").iterdir():
            if entry.name != "nvidia":
                _link(modules / entry.name, entry)
    classes = real / "class"
    if classes.is_dir():
        for entry in classes.iterdir():
            if entry.name != "infiniband":
                _link(top / "class" / entry.name, entry)


def write_tree(node: NodeView, top: Path, real: Path = REAL_SYS) -> list[Path]:
    """Write the node's ``class/infiniband`` under ``top``; returns the port directories."""
    _link_real_sysfs(top, real)
    ports: list[Path] = []
    ib = top / "class" / "infiniband"
    for rail, r in enumerate(node.rails):
        dev = ib / str(r["device"])
        guid = node.guid(rail)[2:].rjust(16, "0")
        colon = ":".join(guid[i : i + 4] for i in range(0, 16, 4))
        _write(dev / "board_id", "MT_0000000838\n")
        _write(dev / "fw_ver", f"{FW}\n")
        _write(dev / "hca_type", f"{CA_TYPE}\n")
        _write(dev / "node_guid", f"{colon}\n")
        _write(dev / "sys_image_guid", f"{colon}\n")
        p = _port(node, rail)
        port = dev / "ports" / "1"
        _write(port / "state", STATE_TEXT[p["state"]] + "\n")
        _write(port / "phys_state", PHYS_TEXT[p["phys"]] + "\n")
        rate = int(p["rate"])
        _write(port / "rate", RATE_TEXT.get(rate, f"{rate} Gb/sec (4X)") + "\n")
        _write(port / "link_layer", f"{p['link_layer']}\n")
        _write(port / "lid", f"{p['lid']:#x}\n")
        _write(port / "sm_lid", f"{p['sm_lid']:#x}\n")
        _write(port / "cap_mask", f"{p['cap']}\n")
        for name, value in port_counters(node, rail).items():
            _write(port / "counters" / name, f"{value}\n")
        ports.append(port)
    return ports


def main(argv: list[str]) -> int:
    """``gpuforge-sim-sysfs [--root DIR] [--every S]``: write the tree once, or every S s."""
    parser = argparse.ArgumentParser(prog="gpuforge-sim-sysfs")
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--every", type=float, default=0.0, help="refresh period; 0: once")
    args = parser.parse_args(argv)
    top = args.root or root()
    while True:
        try:
            write_tree(load_lab().local(), top)
        except SimError as err:
            # no state yet (a node before the lab wrote it): try again on the next tick
            print(f"gpuforge-sim-sysfs: {err.message.splitlines()[-1]}", file=sys.stderr)
            if not args.every:
                return 1
        if not args.every:
            return 0
        time.sleep(args.every)
