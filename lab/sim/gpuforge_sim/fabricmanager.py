"""Simulated ``nv-fabricmanager``: runs in the foreground under systemd, or fails on a fault."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from . import SIM_BANNER
from .state import SimError, driver_version, load_lab

#: Seconds between two looks at the node's state while the daemon runs.
WATCH_S = 2.0
FM_VERSION_FILE = Path("/usr/share/nvidia/nvswitch/gpuforge-sim-fm-version")


def main(argv: list[str]) -> int:
    fm_version = FM_VERSION_FILE.read_text().strip() if FM_VERSION_FILE.exists() else ""
    if "-v" in argv or "--version" in argv:
        print(f"Fabric Manager version is : {fm_version or 'unknown'}")
        print(f"({SIM_BANNER})")
        return 0
    node = load_lab().local()
    drv = driver_version()
    if fm_version and fm_version != drv:
        raise SimError(
            f"fabric manager version {fm_version} is not compatible with the NVIDIA driver "
            f"version {drv}; install the matching fabric manager package",
            rc=1,
        )
    if node.has("fabricmanager_down"):
        print(
            "request to query NVSwitch device information from NVSwitch driver failed with "
            "error:WARNING Nothing to do",
            file=sys.stderr,
        )
        print("Fabric Manager: failed to start, exiting", file=sys.stderr)
        return 1
    print(
        f"Successfully configured all the available NVSwitches to route GPU NVLink traffic. "
        f"NVLink Peer-to-Peer support will be enabled once the GPUs are successfully "
        f"registered with the NVLink fabric. ({SIM_BANNER})"
    )
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return watch(poll_s=float(os.environ.get("GPUFORGE_SIM_FM_POLL", WATCH_S)))


def watch(*, poll_s: float, polls: int | None = None) -> int:
    """Run until the node's state gains ``fabricmanager_down``, then fail as a dying FM does.

    A real Fabric Manager that loses its NVSwitches logs the error and exits, and systemd marks
    the unit failed (it does not restart it); a fault loaded into a running lab therefore takes
    effect within ``poll_s`` seconds, without a daemon restart. ``polls`` bounds the loop (tests).
    """
    done = 0
    while polls is None or done < polls:
        time.sleep(poll_s)
        done += 1
        try:
            down = load_lab().local().has("fabricmanager_down")
        except SimError:
            continue  # a state file being rewritten: look again next time
        if down:
            print(
                "NVSwitch fatal error detected: the fabric is degraded; Fabric Manager is exiting",
                file=sys.stderr,
            )
            sys.stderr.flush()
            return 1
    return 0
