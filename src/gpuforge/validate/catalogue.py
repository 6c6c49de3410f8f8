"""The check catalogue: every check gpuforge runs, defined once, for every path that runs it.

A :class:`CheckSpec` names a check, says what it gathers, which pure judge decides it
(:mod:`gpuforge.validate.checks`, :mod:`~gpuforge.validate.flaps`), its thresholds and the action
its failure calls for. Every path reads it:

* the acceptance levels (``quick``: the testinfra suite in ``validators/``; ``burnin``;
  ``full``), which gather over SSH from the admin host;
* the node tiers (``passive``, ``prolog``, ``epilog``: :mod:`gpuforge.node.probes`), which gather
  on the node itself (the node zipapp ships this module: standard library + PyYAML only);
* nightly conformance (``gpuforge-node conformance``: the passive checks plus drift and DCGM).

Gathering is pluggable, judging is not: both gatherers hand the same parsed output to the same
judge, and the result carries the same check name and the same action.

**Names.** A check's name is its catalogue name (``fabric.flaps``); the name is what a Slurm drain
reason carries (``gpuforge:<check>:<action>``, docs/health.md). Where one run yields a result per
GPU, rail or component (the acceptance suite parametrizes per rail), the instance follows in
brackets, the same way on every path: ``fabric.flaps[0]`` (rail 0), ``software.versions[nccl]``,
``gpu.dcgm_diag[pcie.gpu2]``. :func:`base` strips the instance; :func:`spec` looks a name up with
or without one.

**Actions.** A failed check's action is the judge's when the judgement depends on what failed
(``gpu.xid``: the Xid catalogue's action of each code; ``gpu.row_remap``: Xid 63's or 64's;
``gpu.dcgm_diag``: :data:`DCGM_TEST_ACTIONS`), else the catalogue's (:func:`action`). ``xid``
names the Xid whose catalogue action a check takes (``gpu.count``: Xid 79's, a GPU off the bus),
so the Xid data file (``data/xid_catalogue.yaml``, with its sources) stays the one place those
actions are decided.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuforge.validate.xid_catalogue import Action, lookup

#: Acceptance levels, each including the previous one (``gpuforge validate --level``).
LEVELS = ("quick", "burnin", "full")
#: Node tiers (``gpuforge-node.pyz run --tier``).
NODE_TIERS = ("passive", "prolog", "epilog")
#: The nightly desired-state run (``gpuforge-node conformance``).
CONFORMANCE = "conformance"
#: Admission's action for a failure no catalogue entry names: repair and re-validate.
DEFAULT_ACTION = "quarantine"

#: The IB port counters ``fabric.counters`` reads, by their sysfs names.
COUNTER_NAMES = ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards")
#: Most each counter may grow within ``window_s`` before the check fails.
COUNTER_MAX = {
    "symbol_error": 10,
    "link_downed": 1,
    "port_rcv_errors": 10,
    "port_xmit_discards": 100,
}

#: Packages that carry each pinned version (Debian names; the driver's comes from nvidia-smi).
#: A trailing ``-`` is a prefix followed by the version (``cuda-toolkit-12-4``).
VERSION_PACKAGES: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda-toolkit-",),
    "nccl": ("libnccl2",),
    "dcgm": ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager"),
    "fabricmanager": ("nvidia-fabricmanager-", "nvidia-fabricmanager"),
    "slurm": ("slurmd",),
}
#: The inventory variable that pins each component (the health role renders the same into
#: health.yaml's ``expect.versions``: roles/health/defaults/main.yml, ``health_expect_versions``).
VERSION_PINS = {
    "driver": "nvidia_driver_version",
    "cuda": "cuda_toolkit_version",
    "nccl": "nccl_version",
    "dcgm": "dcgm_version",
    "fabricmanager": "nvidia_driver_version",
    "slurm": "slurm_version",
}
#: The pinned components, in report order (``driver`` first: it is read from nvidia-smi).
VERSION_KEYS = ("driver", *VERSION_PACKAGES)

#: What a failed DCGM diagnostic test calls for, by the test's slug (:func:`slug`). Hardware
#: faults take the action of the Xid that reports the same fault (the Xid catalogue's sources
#: decide it): a memory test Xid 48's (uncorrectable ECC), the row-remap test Xid 63's (pending
#: remap), NVLink Xid 74's; a PCIe link below its generation or width is reseated (``inspect``,
#: as ``gpu.pcie_link``). A test DCGM does not list here, or a failure it does not tie to a test,
#: takes :data:`DCGM_DEFAULT_ACTION`: the node checker's historical ``reboot`` (a reboot clears
#: the driver and fabric-manager states most deployment tests trip on, and re-validation sees
#: what it does not).
DCGM_TEST_ACTIONS: dict[str, int | str] = {
    "page_retirement_row_remap": 63,
    "gpu_memory": 48,
    "memory": 48,
    "memory_bandwidth": 48,
    "nvlink": 74,
    "pcie": "inspect",
}
DCGM_DEFAULT_ACTION = "reboot"
#: Seconds the node's clock may be off the collector's before ``node.clock`` WARNs: a tenth of
#: munge's default credential time-to-live (300 s), beyond which the node's records are refused.
CLOCK_WARN_S = 30


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check: what it reads, how it is judged, its thresholds and its action."""

    name: str
    gathers: str
    judge: str
    #: The action of a FAIL (unless the judge names one from what failed).
    action: str = DEFAULT_ACTION
    #: Take the Xid catalogue's action of this code instead of :attr:`action`.
    xid: int | None = None
    #: Where it runs: acceptance levels, node tiers, ``conformance``.
    runs: tuple[str, ...] = ()
    #: Thresholds; health.yaml may override them per node (``checks.<name>.<key>``).
    params: Mapping[str, Any] = field(default_factory=dict)
    #: Node hysteresis defaults (docs/health.md, "Hysteresis").
    fail_after: int = 1
    pass_after: int = 1
    shadow: bool = False

    @property
    def fail_action(self) -> str:
        """The action of a FAIL that the judge did not name one for."""
        return lookup(self.xid).action.value if self.xid is not None else self.action

    @property
    def on_node(self) -> bool:
        """Does a node tier run it (health.yaml's ``checks:`` keys)?"""
        return any(r in NODE_TIERS for r in self.runs)


_Q, _B, _F = "quick", "burnin", "full"
_P, _PRO, _E, _C = "passive", "prolog", "epilog", CONFORMANCE
_NODE = (_P, _C)

CATALOGUE: tuple[CheckSpec, ...] = (
    # --- GPU ---------------------------------------------------------------------------------
    CheckSpec(
        "gpu.count",
        "nvidia-smi --query-gpu=... --format=csv",
        "checks.gpu_count",
        xid=79,
        runs=(_Q, *_NODE),
    ),
    CheckSpec(
        "gpu.model",
        "nvidia-smi --query-gpu=... --format=csv",
        "checks.gpu_models",
        "inspect",
        runs=(_Q, *_NODE),
    ),
    CheckSpec(
        "gpu.xid",
        "the kernel log (dmesg, else journalctl -k)",
        "checks.no_hardware_xids (the Xid catalogue's action per code)",
        "reboot",
        runs=(_Q, _P, _PRO, _E, _C),
    ),
    CheckSpec(
        "gpu.ecc_uncorrectable",
        "nvidia-smi -q -x",
        "checks.no_uncorrectable_ecc",
        xid=48,
        runs=(_Q, _P, _E, _C),
    ),
    CheckSpec(
        "gpu.row_remap",
        "nvidia-smi -q -x",
        "checks.row_remap_healthy (Xid 63's action, Xid 64's on a remap failure)",
        xid=63,
        runs=(_Q, _P, _E, _C),
    ),
    CheckSpec(
        "gpu.nvlink",
        "nvidia-smi nvlink -s",
        "checks.nvlink_all_up",
        xid=74,
        runs=(_Q, *_NODE),
        fail_after=2,
        pass_after=2,
    ),
    CheckSpec(
        "gpu.pcie_link",
        "nvidia-smi -q -x",
        "checks.pcie_link",
        "inspect",
        runs=(_Q, *_NODE),
        fail_after=3,
        pass_after=2,
    ),
    CheckSpec(
        "gpu.throttle",
        "nvidia-smi -q -x",
        "checks.no_throttling",
        "inspect",
        runs=(_Q, *_NODE),
        fail_after=3,
        pass_after=3,
    ),
    CheckSpec("gpu.persistence_mode", "nvidia-smi -q -x", "checks.persistence_enabled", runs=(_Q,)),
    CheckSpec("gpu.ecc_enabled", "nvidia-smi -q -x", "checks.ecc_enabled", runs=(_Q,)),
    CheckSpec(
        "gpu.power_cap",
        "3 samples of nvidia-smi --query-gpu=<POWER_QUERY>",
        "checks.power_cap_held",
        runs=(_Q,),
    ),
    # --- fabric ------------------------------------------------------------------------------
    CheckSpec(
        "fabric.port",
        "ibstat",
        "checks.ib_ports",
        "inspect",
        runs=(_Q, *_NODE),
        fail_after=2,
        pass_after=2,
    ),
    CheckSpec(
        "fabric.mtu",
        "/sys/class/net/<netdev>/mtu",
        "checks.mtu_matches",
        runs=(_Q, *_NODE),
    ),
    CheckSpec(
        "fabric.counters",
        "/sys/class/infiniband/<dev>/ports/<port>/counters/<COUNTER_NAMES>",
        "checks.counter_growth",
        "inspect",
        # growth needs two samples under load: acceptance reads them around burn-in and NCCL
        runs=(_B, _F, _P, _PRO, _C),
        params={"window_s": 3600, "max": COUNTER_MAX},
        fail_after=2,
        pass_after=3,
    ),
    CheckSpec(
        "fabric.flaps",
        "the dated kernel log (Link down/up) and link_downed",
        "flaps.count + flaps.judge, flaps.dropped",
        "inspect",
        runs=(_Q, *_NODE),
        params={"down_s": 240, "flaps": 3, "window_h": 12},
    ),
    CheckSpec(
        "fabric.roce_pfc",
        "ethtool -S <netdev> (rx/tx_prio<N>_pause)",
        "checks.counter_growth (WARN only)",
        "monitor",
        runs=_NODE,
        params={"window_s": 3600, "max_pause": 1000000},
        fail_after=2,
        pass_after=3,
        shadow=True,
    ),
    CheckSpec("fabric.sysctls", "sysctl -e <keys>", "checks.sysctl_conformance", runs=(_Q,)),
    CheckSpec("fabric.nccl_conf", "/etc/nccl.conf", "checks.sysctl_values", runs=(_Q,)),
    # --- software ----------------------------------------------------------------------------
    CheckSpec(
        "software.versions",
        "driver from nvidia-smi, the rest dpkg-query -W (VERSION_PACKAGES)",
        "checks.pinned_versions",
        runs=(_Q, *_NODE),
    ),
    CheckSpec(
        "software.services",
        "systemctl is-active",
        "checks.services_active",
        "reboot",
        runs=(_Q, *_NODE),
        fail_after=2,
        pass_after=1,
    ),
    CheckSpec(
        "node.clock",
        "the collector's clock in its last answer (collector_time), half the round trip "
        "corrected, kept in state.json",
        "checks.clock_offset (WARN only)",
        "monitor",
        runs=_NODE,
        # munge refuses a credential beyond its time-to-live (300 s by default): warn far below
        # it; a measurement older than max_age_s (the collector away) is none.
        params={"warn_s": CLOCK_WARN_S, "max_age_s": 3600},
    ),
    CheckSpec(
        "gpu.dcgm_diag",
        "dcgmi diag -r N -j (epilog -r 1, nightly burnin -r 2, acceptance burnin -r 2/3)",
        "checks.dcgm_diag_failures (DCGM_TEST_ACTIONS per failed test)",
        DCGM_DEFAULT_ACTION,
        runs=(_B, _F, _E, _C),
    ),
    CheckSpec("software.module", "lsmod", "loaded or not", runs=(_Q,)),
    # --- burn-in and NCCL (acceptance only) -----------------------------------------------
    CheckSpec("burnin.gpu_burn", "gpu_burn <seconds>", "burnin.gpu_burn_check", runs=(_B, _F)),
    CheckSpec(
        "burnin.ib_write_bw", "ib_write_bw per rail and pair", "burnin.judge_pair", runs=(_B, _F)
    ),
    CheckSpec(
        "nccl.allreduce_nvlink", "all_reduce_perf -g N", "nccl.judge_single_node", runs=(_F,)
    ),
    CheckSpec("nccl.multinode", "srun all_reduce_perf", "nccl.localization_results", runs=(_F,)),
    # --- the run itself and desired state ---------------------------------------------------
    CheckSpec("node.unreachable", "sshd answers", "reach.probe", runs=LEVELS),
    CheckSpec(
        "conformance.drift",
        "/etc/gpuforge/expected/state/*.json against the node",
        "node.drift.compare",
        runs=(_C,),
    ),
    CheckSpec(
        "conformance.firmware",
        "/sys/class/infiniband/*/fw_ver, nvidia-smi vbios",
        "conformance.judge.firmware_outliers (controller, across the node type)",
        runs=(_C,),
        shadow=True,
    ),
)

BY_NAME: dict[str, CheckSpec] = {s.name: s for s in CATALOGUE}
_INSTANCE = re.compile(r"\[[^\]]*\]$")


def base(name: str) -> str:
    """``fabric.flaps[0]`` -> ``fabric.flaps``; ``burnin.gpu_burn.min_gflops`` ->
    ``burnin.gpu_burn`` (a family member takes its family's entry)."""
    bare = _INSTANCE.sub("", name)
    while bare not in BY_NAME and "." in bare.split(".", 1)[1]:
        bare = bare.rsplit(".", 1)[0]
    return bare


def spec(name: str) -> CheckSpec | None:
    """The catalogue entry of ``name`` (with or without an instance), None when unlisted."""
    return BY_NAME.get(base(name))


def action(name: str, named: str = "") -> str:
    """The action of a FAIL of ``name``: the judge's own (``named``) or the catalogue's."""
    if named:
        return named
    found = spec(name)
    return found.fail_action if found else DEFAULT_ACTION


def result_action(name: str, *, ok: bool, warn: bool, named: str = "") -> str:
    """The action a result of ``name`` carries: none on a pass, ``monitor`` on a warning, the
    judge's or the catalogue's on a failure (:func:`action`). Every path calls this."""
    if ok:
        return ""
    return "monitor" if warn else action(name, named)


def action_rank(name: str | None) -> int:
    """How strong an action is: the Xid catalogue's order, ``quarantine`` with ``reset_gpu``
    (between ``monitor`` and a hardware action); an unknown one is 0."""
    if name == DEFAULT_ACTION:
        return Action.RESET_GPU.rank
    try:
        return Action(name or "none").rank
    except ValueError:
        return 0


def strongest(actions: Sequence[str]) -> str:
    """The strongest of ``actions`` (the first of equals), empty for none."""
    return max(actions, key=action_rank) if actions else ""


def params(name: str) -> dict[str, Any]:
    """The default thresholds of ``name`` (a copy)."""
    found = spec(name)
    return dict(found.params) if found else {}


def node_checks() -> dict[str, CheckSpec]:
    """The checks of the node tiers (health.yaml's ``checks:`` keys), in catalogue order."""
    return {s.name: s for s in CATALOGUE if s.on_node}


def slug(text: str) -> str:
    """``Page Retirement/Row Remap`` -> ``page_retirement_row_remap``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "test"


#: DCGM's words for an Xid it saw in a test (``DCGM_FR_XID_ERROR``: "Detected XID %d for GPU %u").
_DCGM_XID = re.compile(r"\bXID (\d+)\b", re.IGNORECASE)


def dcgm_action(test: str, said: Sequence[str] = ()) -> str:
    """The action a failed DCGM test calls for (:data:`DCGM_TEST_ACTIONS`); when DCGM's own
    words (``said``) cite an Xid, the stronger of that and the Xid's catalogue action, so that a
    GPU that fell off the bus (Xid 79) gets the same action from DCGM as from ``gpu.xid``."""
    found = DCGM_TEST_ACTIONS.get(slug(test), DCGM_DEFAULT_ACTION)
    own = lookup(found).action.value if isinstance(found, int) else found
    cited = [lookup(int(code)).action.value for m in said for code in _DCGM_XID.findall(m)]
    return strongest([own, *cited])
