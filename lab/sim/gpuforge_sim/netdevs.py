"""gpuforge-sim-netdevs: one network interface per rail, standing in for IPoIB/RoCE netdevs.

On a real GPU node the HCA driver creates ``ib0``..``ib7`` (IPoIB) or the RoCE Ethernet ports,
and the fabric roles configure them through systemd-networkd. A lab container has no HCA, so at
boot this creates a standalone link per rail of the node's state under the rail's ``netdev`` name:
a ``dummy`` link, or where the host kernel has no dummy module (a container cannot load one) an
empty ``bridge``, which takes any MTU up to 65535 and an address just as well.
The fabric roles then configure them exactly as on a real node (MTU, addresses, per-interface
sysctls), and the validators read the result back. Needs CAP_NET_ADMIN (the lab grants it).
"""

from __future__ import annotations

import subprocess

from .state import SimError, load_lab

IP = "/usr/sbin/ip"
#: Link kinds tried in order; the first the kernel knows is used.
KINDS = ("dummy", "bridge")


def _exists(name: str) -> bool:
    proc = subprocess.run(
        [IP, "link", "show", "dev", name], capture_output=True, check=False, timeout=10
    )
    return proc.returncode == 0


def main(argv: list[str]) -> int:
    if argv:
        raise SimError("usage: gpuforge-sim-netdevs (no arguments)", rc=2)
    try:
        rails = load_lab().local().rails
    except SimError:
        print("gpuforge-sim-netdevs: no simulator state on this node; no rail interfaces")
        return 0
    for rail in rails:
        name = str(rail.get("netdev") or "")
        if not name or _exists(name):
            continue
        errors = []
        for kind in KINDS:
            proc = subprocess.run(
                [IP, "link", "add", name, "type", kind],
                capture_output=True,
                text=True,
                check=False,
                timeout=10,
            )
            if proc.returncode == 0:
                print(f"gpuforge-sim-netdevs: created {name} ({kind}) for rail {rail.get('rail')}")
                break
            errors.append(f"{kind}: {proc.stderr.strip()}")
        else:
            raise SimError(f"gpuforge-sim-netdevs: cannot create {name}: {'; '.join(errors)}")
    return 0
