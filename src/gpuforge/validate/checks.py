"""Node checks as pure functions: parsed tool output + expectation -> :class:`JudgeOutcome`.

The testinfra suite (validators/) gathers the output on the node and asserts on these; keeping
the judgement here makes every rule unit-testable against real-format samples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuforge.validate import catalogue
from gpuforge.validate.parsers import xid
from gpuforge.validate.parsers.dcgmi import DcgmDiag, DiagTest
from gpuforge.validate.parsers.ibstat import IbstatReport
from gpuforge.validate.parsers.nvidia_smi_common import GpuInfo, NvidiaSmiReport
from gpuforge.validate.parsers.nvidia_smi_csv import NvidiaSmiCsv
from gpuforge.validate.parsers.nvlink import NvlinkStatus
from gpuforge.validate.xid_catalogue import Action, lookup

#: Fields the GPU inventory query asks for (``nvidia-smi --query-gpu=... --format=csv``).
GPU_QUERY = "index,name,pci.bus_id,driver_version,persistence_mode,ecc.mode.current"

#: Clock event reasons that are normal on a healthy, idle or capped GPU.
BENIGN_CLOCK_REASONS = frozenset(
    {
        "gpu idle",
        "idle",
        "applications clocks setting",
        "sw power cap",
        "power cap",
        "sync boost",
        "display clock setting",
        "none",
    }
)


@dataclass(frozen=True)
class JudgeOutcome:
    """The judgement of one fact: ``ok`` or not, with what was seen and what was wanted."""

    ok: bool
    measured: str | int | float | None
    expected: str | int | float | None
    detail: str = ""
    #: Not ok, but only worth a warning (the fact may have a benign cause the check cannot see).
    warn_only: bool = False
    #: The remediation a failure calls for (an :class:`~gpuforge.validate.xid_catalogue.Action`
    #: value); empty: the default (``quarantine``: repair and re-validate).
    action: str = ""

    def explain(self) -> str:
        """The assertion message: measured, expected and why."""
        text = f"measured {self.measured!r}, expected {self.expected!r}"
        return f"{text}: {self.detail}" if self.detail else text


def normalize_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3`` for comparisons."""
    return re.sub(r"^NVIDIA\s+", "", name.strip(), flags=re.IGNORECASE)


def model_matches(product: str, expected_model: str) -> bool:
    """Does nvidia-smi's product name fit the topology's ``gpu_model`` (``H100-SXM-80GB``)?

    The chip (``H100``) must appear; a memory size in the expected model must appear too.
    """
    got = normalize_model(product).upper().replace("-", " ")
    tokens = expected_model.upper().replace("-", " ").split()
    if not tokens or tokens[0] not in got.split():
        return False
    sizes = [t for t in tokens if re.fullmatch(r"\d+GB", t)]
    return all(s in got for s in sizes)


def gpu_count(csv: NvidiaSmiCsv, expected: int) -> JudgeOutcome:
    """Exactly ``expected`` GPUs visible."""
    n = len(csv.rows)
    return JudgeOutcome(n == expected, n, expected, "" if n == expected else "GPU missing or extra")


def gpu_models(csv: NvidiaSmiCsv, expected_model: str) -> JudgeOutcome:
    """Every GPU is the expected model."""
    names = [str(r.values.get("name") or "") for r in csv.rows]
    bad = [n for n in names if not model_matches(n, expected_model)]
    return JudgeOutcome(not bad and bool(names), ",".join(sorted(set(names))), expected_model)


def csv_all_equal(csv: NvidiaSmiCsv, field: str, expected: str) -> JudgeOutcome:
    """Every GPU reports ``field`` == ``expected`` (case-insensitive)."""
    values = [str(r.values.get(field)) for r in csv.rows]
    bad = sorted({v for v in values if v.lower() != expected.lower()})
    return JudgeOutcome(bool(values) and not bad, ",".join(sorted(set(values))), expected)


def exact_version(measured: str | None, expected: str) -> JudgeOutcome:
    """An installed version equals the pinned one (a package version may carry a ``-1`` suffix)."""
    got = (measured or "").strip()
    base = got.split(":", 1)[-1]  # epoch
    ok = bool(got) and (base == expected or base.startswith(expected + "-"))
    return JudgeOutcome(ok, got or None, expected, "" if ok else "version differs from the pin")


def _gpu_label(g: GpuInfo, i: int) -> str:
    return g.pci_bus_id or f"gpu{i}"


def ecc_enabled(report: NvidiaSmiReport) -> JudgeOutcome:
    """ECC mode is Enabled on every GPU."""
    modes = [(g.ecc_mode or "N/A") for g in report.gpus]
    ok = bool(modes) and all(m.lower() == "enabled" for m in modes)
    return JudgeOutcome(ok, ",".join(sorted(set(modes))), "Enabled")


def no_uncorrectable_ecc(report: NvidiaSmiReport) -> JudgeOutcome:
    """No volatile uncorrectable ECC error (SRAM or DRAM) on any GPU since the driver loaded."""
    bad = []
    for i, g in enumerate(report.gpus):
        v = g.ecc_volatile
        if v is None:
            continue
        total = (v.sram_uncorrectable or 0) + (v.dram_uncorrectable or 0)
        if total:
            bad.append(f"{_gpu_label(g, i)}={total}")
    return JudgeOutcome(not bad, ";".join(bad) or 0, 0, "uncorrectable ECC errors" if bad else "")


def row_remap_healthy(report: NvidiaSmiReport) -> JudgeOutcome:
    """No pending row remap (needs a GPU reset) and no remap failure (needs an RMA)."""
    bad = []
    for i, g in enumerate(report.gpus):
        rr = g.remapped_rows
        if rr is None:
            continue
        if rr.failure_occurred:
            bad.append(f"{_gpu_label(g, i)}: remap failure")
        elif rr.pending:
            bad.append(f"{_gpu_label(g, i)}: remap pending")
        if g.retired_pages_pending:
            bad.append(f"{_gpu_label(g, i)}: page retirement pending")
    # A remap failure is Xid 64's fault (hardware), a pending remap Xid 63's (a GPU reset).
    failed = any("remap failure" in b for b in bad)
    act = lookup(64 if failed else 63).action.value if bad else ""
    return JudgeOutcome(not bad, ";".join(bad) or "none", "none pending, no failure", action=act)


def persistence_enabled(report: NvidiaSmiReport) -> JudgeOutcome:
    """Persistence mode on every GPU."""
    modes = [(g.persistence_mode or "N/A") for g in report.gpus]
    ok = bool(modes) and all(m.lower() == "enabled" for m in modes)
    return JudgeOutcome(ok, ",".join(sorted(set(modes))), "Enabled")


def _idle(g: GpuInfo) -> bool:
    return any(
        r.lower().replace("_", " ") in ("gpu idle", "idle") for r in g.clocks_event_reasons_active
    )


def pcie_link(
    report: NvidiaSmiReport, *, gen: int | None = None, width: int | None = None
) -> JudgeOutcome:
    """Every GPU's PCIe link runs at the expected generation and width.

    ``gen``/``width`` are the node type's (topology, else the SKU's); without them the device
    maximum is the expectation. A link below either fails, except one thing: a GPU that reports
    itself idle may lower its link generation to save power, so an idle GPU whose link is
    capable of ``gen`` (max) but runs below it now is a warning (``warn_only``): DCGM's PCIe
    test checks it again under load. A maximum below ``gen`` (a slot or riser that cannot train
    to it) always fails.
    """
    bad: list[str] = []
    idle_low: list[str] = []
    seen: list[str] = []
    for i, g in enumerate(report.gpus):
        label = _gpu_label(g, i)
        want_w = width or g.pcie_width_max
        want_g = gen or g.pcie_gen_max
        cur_g, cur_w = g.pcie_gen_current, g.pcie_width_current
        seen.append(f"gen{cur_g}x{cur_w}")
        if want_w and cur_w and cur_w < want_w:
            bad.append(f"{label} x{cur_w}<x{want_w}")
        if gen and g.pcie_gen_max and g.pcie_gen_max < gen:
            bad.append(f"{label} max gen{g.pcie_gen_max}<gen{gen}")
        elif want_g and cur_g and cur_g < want_g:
            (idle_low if _idle(g) else bad).append(f"{label} gen{cur_g}<gen{want_g}")
    exp = f"gen{gen or 'max'} x{width or 'max'}"
    measured = ",".join(sorted(set(seen)))
    if bad or not seen:
        return JudgeOutcome(False, measured, exp, "; ".join(bad + idle_low))
    if idle_low:
        detail = "; ".join(idle_low) + " while idle (power saving?); DCGM's PCIe test runs loaded"
        return JudgeOutcome(False, measured, exp, detail, warn_only=True)
    return JudgeOutcome(True, measured, exp)


def no_throttling(report: NvidiaSmiReport) -> JudgeOutcome:
    """No active clock event reason other than idle / application clocks / power cap."""
    bad = []
    for i, g in enumerate(report.gpus):
        active = [
            r
            for r in g.clocks_event_reasons_active
            if r.lower().replace("_", " ") not in BENIGN_CLOCK_REASONS
        ]
        if active:
            bad.append(f"{_gpu_label(g, i)}: {', '.join(active)}")
    return JudgeOutcome(not bad, "; ".join(bad) or "none", "idle or power cap only")


#: Fields of one power-cap sample (``nvidia-smi --query-gpu=... --format=csv``). The
#: ``clocks_throttle_reasons`` spelling is the one every driver since R418 accepts (R535 added
#: ``clocks_event_reasons`` and kept the old name).
POWER_QUERY = (
    "index,pci.bus_id,clocks_throttle_reasons.sw_power_cap,utilization.gpu,clocks.current.sm,"
    "clocks.max.sm,power.draw,enforced.power.limit,power.default_limit"
)
#: A GPU busier than this may sit at its power cap legitimately.
POWER_CAP_LIGHT_LOAD_PCT = 50.0
#: Below this fraction of its maximum SM clock, a GPU at its power cap is held down, not capped.
POWER_CAP_CLOCK_FRACTION = 0.9


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", str(value or ""))
    return float(m.group(1)) if m else None


def power_cap_held(samples: Sequence[NvidiaSmiCsv]) -> JudgeOutcome:
    """No GPU is held at its power cap under a light load (every sample of ``POWER_QUERY``).

    A GPU working hard sits at its power cap by design ("SW Power Cap" active, clocks a little
    down). A GPU with that reason active in *every* sample while it is lightly loaded (GPU
    utilization below ``POWER_CAP_LIGHT_LOAD_PCT``) and its SM clock below
    ``POWER_CAP_CLOCK_FRACTION`` of its maximum is held there: a lowered power limit, a faulty
    power sensor or a board-level cap. The enforced limit is reported when it is below the
    default limit, as the likely cause.
    """
    if not samples or not all(s.rows for s in samples):
        return JudgeOutcome(
            False, "no samples", "samples of every GPU", "nvidia-smi printed no rows"
        )
    per_gpu: dict[str, list[dict[str, object]]] = {}
    for sample in samples:
        for row in sample.rows:
            key = str(row.values.get("pci.bus_id") or row.values.get("index"))
            per_gpu.setdefault(key, []).append(dict(row.values))
    held = []
    for key, rows in per_gpu.items():
        capped = [
            str(
                r.get("clocks_throttle_reasons.sw_power_cap")
                or r.get("clocks_event_reasons.sw_power_cap")
                or ""
            ).strip()
            for r in rows
        ]
        if len(rows) < len(samples) or not all(c == "Active" for c in capped):
            continue
        util = [_num(r.get("utilization.gpu")) for r in rows]
        sm = [_num(r.get("clocks.current.sm")) for r in rows]
        sm_max = _num(rows[-1].get("clocks.max.sm")) or 0.0
        light = all(u is not None and u < POWER_CAP_LIGHT_LOAD_PCT for u in util)
        slow = sm_max > 0 and all(
            c is not None and c < POWER_CAP_CLOCK_FRACTION * sm_max for c in sm
        )
        if not (light and slow):
            continue
        limit = _num(rows[-1].get("enforced.power.limit"))
        default = _num(rows[-1].get("power.default_limit"))
        draw = _num(rows[-1].get("power.draw"))
        text = (
            f"GPU {rows[-1].get('index')} ({key}): SW Power Cap in {len(rows)}/{len(rows)} "
            f"samples at {max(u or 0 for u in util):.0f}% load, "
            f"SM {min(c or 0 for c in sm):.0f}/{sm_max:.0f} MHz"
        )
        if draw is not None and limit is not None:
            text += f", {draw:.0f} W of {limit:.0f} W"
        if limit is not None and default and limit < 0.98 * default:
            text += f" (limit lowered from the default {default:.0f} W)"
        held.append(text)
    expected = (
        f"no GPU at its power cap below {POWER_CAP_LIGHT_LOAD_PCT:.0f}% load and "
        f"{POWER_CAP_CLOCK_FRACTION:.0%} of its max SM clock"
    )
    return JudgeOutcome(not held, "; ".join(held) or "none held", expected, "; ".join(held))


def split_csv_samples(text: str) -> list[str]:
    """Split repeated ``--format=csv`` outputs (each starting with its header line) apart."""
    out: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("index,") or line.startswith("index, ") or not out:
            out.append([])
        out[-1].append(line)
    return ["\n".join(block) for block in out if any(b.strip() for b in block)]


def nvlink_all_up(
    status: NvlinkStatus, *, gpus: int, links_per_gpu: int | None = None
) -> JudgeOutcome:
    """Every GPU shows all its NVLink links active (and the same number on every GPU)."""
    counts = {g.index: g.active_links for g in status.gpus}
    totals = {g.index: len(g.links) for g in status.gpus}
    want = links_per_gpu or (max(totals.values()) if totals else 0)
    bad = [
        f"GPU{i}: {counts[i]}/{want}" + (f" ({g.error})" if g.error else "")
        for i, g in ((g.index, g) for g in status.gpus)
        if counts[i] < want or g.error
    ]
    if len(status.gpus) != gpus:
        bad.append(f"{len(status.gpus)} GPUs listed, {gpus} expected")
    ok = not bad and want > 0
    return JudgeOutcome(
        ok, "; ".join(bad) or f"{want} links x {gpus}", f"{want or '>0'} links up per GPU"
    )


def ib_ports(
    report: IbstatReport,
    rails: Sequence[Mapping[str, object]],
    *,
    rate_gbps: float,
    link_layer: str,
) -> list[tuple[str, JudgeOutcome]]:
    """One outcome per rail: its device's port 1 Active, LinkUp, at ``rate_gbps``, right layer."""
    by_name = {ca.name: ca for ca in report.cas}
    out = []
    for rail in rails:
        dev = str(rail["device"])
        want_rate = float(str(rail.get("rate_gbps") or rate_gbps))
        ca = by_name.get(dev)
        expected = f"Active/LinkUp {want_rate:g} Gb/s {link_layer}"
        if ca is None or not ca.ports:
            out.append((dev, JudgeOutcome(False, "absent", expected, f"{dev} not in ibstat")))
            continue
        p = ca.ports[0]
        measured = f"{p.state}/{p.physical_state} {p.rate_gbps or 0:g} Gb/s {p.link_layer}"
        problems = []
        if (p.state or "").lower() != "active":
            problems.append(f"state {p.state}")
        if (p.physical_state or "").lower() != "linkup":
            problems.append(f"physical state {p.physical_state}")
        if p.rate_gbps is None or p.rate_gbps < want_rate:
            problems.append(f"rate {p.rate_gbps} < {want_rate:g}")
        if (p.link_layer or "").lower() != link_layer.lower():
            problems.append(f"link layer {p.link_layer}")
        out.append((dev, JudgeOutcome(not problems, measured, expected, "; ".join(problems))))
    return out


def no_hardware_xids(kernel_log: str) -> JudgeOutcome:
    """Judge the Xids in a kernel log by the Xid catalogue (``validate/data/xid_catalogue.yaml``).

    * any Xid whose catalogue action drains (``reset_gpu``, ``reboot``, ``inspect``, ``rma``) and
      that is not application-caused, or a "fallen off the bus" report (Xid 79's ``reboot``),
      fails; the outcome's ``action`` is the strongest such action;
    * otherwise an application-caused Xid (13, 31, 43, ...), one whose action is ``monitor`` or
      one the catalogue does not list is a warning with action ``monitor``: the job failed, the
      node stays in service (a recurrence across jobs is for the health history to judge);
    * ``none`` Xids (45, a follow-on report) and a log without Xids pass.

    ``measured`` names each code with its GPU and action: ``79@0000:91:00=reboot``.
    """
    events = xid.with_lines(kernel_log, xid.read(kernel_log))
    fallen = [ln for ln in kernel_log.splitlines() if "fallen off the bus" in ln]
    drains: list[tuple[xid.XidEvent, str, Action]] = []
    watch: list[tuple[xid.XidEvent, str]] = []
    for e, line in events:
        entry = lookup(e.xid)
        if entry.action.drains and not entry.user_caused:
            drains.append((e, line, entry.action))
        elif entry.action is not Action.NONE:
            watch.append((e, line))
    flagged = sorted({f"{e.xid}@{e.pci}={a.value}" for e, _, a in drains})
    actions = [a for _, _, a in drains]
    if fallen and 79 not in {e.xid for e, _, _ in drains}:
        flagged.append(f"fallen-off-the-bus={lookup(79).action.value}")
        actions.append(lookup(79).action)
    if actions:
        detail = "\n".join([line for _, line, _ in drains][:5] + fallen[:2])
        worst = max(actions, key=lambda a: a.rank)
        return JudgeOutcome(False, ",".join(flagged), "no hardware Xid", detail, action=worst.value)
    if watch:
        seen = sorted({f"{e.xid}@{e.pci}={lookup(e.xid).action.value}" for e, _ in watch})
        detail = "application or monitor-only Xids: " + "\n".join(ln for _, ln in watch[:5])
        return JudgeOutcome(
            False, ",".join(seen), "no hardware Xid", detail, warn_only=True, action="monitor"
        )
    return JudgeOutcome(True, "none", "no hardware Xid")


def sysctl_values(measured: Mapping[str, str], expected: Mapping[str, object]) -> JudgeOutcome:
    """Every expected sysctl has the expected value (whitespace-insensitive)."""
    bad = []
    for key, want in sorted(expected.items()):
        got = measured.get(key)
        if got is None or " ".join(str(got).split()) != " ".join(str(want).split()):
            bad.append(f"{key}={got!r} (want {want!r})")
    return JudgeOutcome(
        not bad, "; ".join(bad) or f"{len(expected)} ok", f"{len(expected)} sysctls"
    )


#: The note a node with a read-only ``/proc/sys`` gets instead of a warning.
READ_ONLY_SYSCTL_NOTE = (
    "/proc/sys is read-only on this host (a container), so nothing can set these live: "
    "checked the values /etc/sysctl.d applies at boot"
)


def sysctl_conformance(
    live: Mapping[str, str],
    expected: Mapping[str, object],
    *,
    read_only: bool = False,
    at_boot: Mapping[str, str] | None = None,
) -> JudgeOutcome:
    """The live sysctls match; where ``/proc/sys`` is read-only, the boot-time ones must.

    A read-only ``/proc/sys`` (a container's) cannot hold the values, so there the check is on
    what ``/etc/sysctl.d`` configures (``at_boot``): a match passes with
    ``READ_ONLY_SYSCTL_NOTE`` as its detail (a note, not a warning), a mismatch fails.
    """
    now = sysctl_values(live, expected)
    if now.ok or not read_only:
        return now
    booted = sysctl_values(at_boot or {}, expected)
    if booted.ok:
        return JudgeOutcome(True, booted.measured, booted.expected, READ_ONLY_SYSCTL_NOTE)
    return JudgeOutcome(
        False,
        booted.measured,
        booted.expected,
        f"/proc/sys is read-only and /etc/sysctl.d does not set the values: {booted.measured}",
    )


#: Bytes of the IPoIB encapsulation header (RFC 4391), which datagram mode takes off the MTU.
IPOIB_HEADER = 4


def mtu_matches(measured: str | int | None, expected: int, *, link_layer: str) -> JudgeOutcome:
    """A rail's netdev MTU is the declared one; IPoIB in datagram mode caps it at the IB MTU
    less its 4-byte header, so on InfiniBand that value matches too."""
    text = str(measured if measured is not None else "").strip()
    got = int(text) if text.isdigit() else None
    ok = got == expected or (link_layer.lower() == "infiniband" and got == expected - IPOIB_HEADER)
    return JudgeOutcome(ok, got if got is not None else (text or None), expected)


def parse_kv(text: str, sep: str = "=") -> dict[str, str]:
    """``key = value`` lines (sysctl -a, nccl.conf), comments and blanks skipped."""
    out = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if sep in line:
            k, v = line.split(sep, 1)
            out[k.strip()] = v.strip()
    return out


def counter_growth(
    deltas: Mapping[str, float], maxima: Mapping[str, int], *, window_s: float
) -> JudgeOutcome:
    """Each error counter grew by at most its maximum within the window.

    ``deltas`` maps a counter key ending in the counter's name (``ib/mlx5_0/1/symbol_error``) to
    its growth within ``window_s``; ``maxima`` maps the name to the most it may grow. A counter
    without a maximum is reported, never judged.
    """
    over = []
    for key, delta in sorted(deltas.items()):
        name = key.rsplit("/", 1)[-1]
        limit = maxima.get(name, maxima.get(key))
        if limit is not None and delta > limit:
            over.append(f"{key} +{delta:g} > {limit}")
    window = f"{window_s / 3600:g} h" if window_s >= 3600 else f"{window_s:g} s"
    grown = sum(1 for d in deltas.values() if d > 0)
    measured = "; ".join(over) or f"{grown} of {len(deltas)} counters grew, none over its maximum"
    expected = f"growth within {window} at most " + ", ".join(
        f"{k}={v}" for k, v in sorted(maxima.items())
    )
    detail = "error counters grew faster than allowed" if over else ""
    return JudgeOutcome(not over, measured, expected, detail)


def clock_offset(offset_s: float, rtt_s: float, *, warn_s: float) -> JudgeOutcome:
    """The node's clock within ``warn_s`` of the collector's; beyond it only a warning (a wrong
    clock is no hardware fault: jobs run, but munge refuses the node's credentials once it is
    off by more than their time-to-live, and every dated record misleads).

    ``offset_s``: the collector's clock less the node's (positive: the node is behind), good to
    ``rtt_s / 2``.
    """
    ok = abs(offset_s) <= warn_s
    expected = f"|offset| <= {warn_s:g} s"
    if ok:
        return JudgeOutcome(True, round(offset_s, 3), expected)
    side = "behind" if offset_s > 0 else "ahead of"
    detail = (
        f"the node's clock is {abs(offset_s):.1f} s {side} the collector's (within "
        f"{rtt_s / 2:.3f} s): check its time service (chrony, systemd-timesyncd)"
    )
    return JudgeOutcome(False, round(offset_s, 3), expected, detail, warn_only=True)


def pinned_version(measured: str | None, expected: str) -> JudgeOutcome:
    """An installed version matches its pin: equal, or the pin followed by ``.``, ``-`` or ``+``.

    A pin names as much of the version as the site fixes: ``22.05`` accepts ``22.05.8-4``,
    ``2.21.5`` accepts ``2.21.5-1+cuda12.4``; ``2.21`` does not accept ``2.210.0``. The Debian
    epoch (``1:``) is ignored.
    """
    got = (measured or "").strip()
    base = got.split(":", 1)[-1] if re.match(r"^\d+:", got) else got
    ok = bool(got) and (
        base == expected or base.startswith((expected + ".", expected + "-", expected + "+"))
    )
    return JudgeOutcome(ok, got or None, expected, "" if ok else "version differs from the pin")


#: The one query of installed packages (every path: the node checker, the acceptance suite, the
#: upgrade query, drift): name, version, status, one package a line.
DPKG_QUERY = ("dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${db:Status-Status}\\n")


def parse_installed(text: str) -> dict[str, str]:
    """``{package: version}`` of the installed packages in a ``dpkg-query -W`` listing.

    The status field may be ``${db:Status-Status}`` (``installed``), ``${db:Status-Abbrev}``
    (``ii``, ``hi``: held, how the roles leave their pins; the second letter says installed) or
    absent (``rpm -q`` output, which lists installed packages only).
    """
    out = {}
    for line in text.splitlines():
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            continue
        status = parts[2].strip() if len(parts) > 2 else ""
        if status in ("", "installed") or (len(status) <= 3 and status[1:2] == "i"):
            out[parts[0]] = parts[1]
    return out


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a (package) version: ``1:4.2.3-1`` -> (4, 2, 3)."""
    text = version.strip().split(":", 1)[-1] if re.match(r"^\d+:", version.strip()) else version
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def package_version(
    installed: Mapping[str, str], names: Sequence[str], pin: str | None = None
) -> str | None:
    """The version of the first of ``names`` installed (a trailing ``-``: a prefix followed by
    digits, e.g. ``cuda-toolkit-``: of several side by side, the one matching ``pin``, else the
    newest)."""
    for name in names:
        if name.endswith("-"):
            found = sorted(
                (
                    v
                    for k, v in installed.items()
                    if k.startswith(name) and k[len(name) : len(name) + 1].isdigit()
                ),
                key=release,
            )
            match = [v for v in found if pin and pinned_version(v, pin).ok]
            if match or found:
                return (match or found)[-1]
        elif name in installed:
            return installed[name]
    return None


def pinned_versions(measured: Mapping[str, str | None], pins: Mapping[str, str]) -> JudgeOutcome:
    """Every pinned component's installed version matches (:func:`pinned_version`)."""
    bad = []
    seen = []
    for key in sorted(pins):
        got = measured.get(key)
        seen.append(f"{key}={got or 'absent'}")
        if not pinned_version(got, pins[key]).ok:
            bad.append(f"{key} {got or 'absent'} != {pins[key]}")
    return JudgeOutcome(
        not bad,
        ", ".join(seen),
        ", ".join(f"{k}={v}" for k, v in sorted(pins.items())),
        "; ".join(bad),
    )


def services_active(states: Mapping[str, str]) -> JudgeOutcome:
    """Every service's ``systemctl is-active`` state is ``active``."""
    bad = [f"{name} {state}" for name, state in states.items() if state != "active"]
    measured = ", ".join(f"{n}={s}" for n, s in states.items())
    return JudgeOutcome(not bad, measured, "all active", "; ".join(bad))


@dataclass(frozen=True)
class DcgmFailure:
    """One failed DCGM test: its GPUs, DCGM's own words for it and the action it calls for."""

    test: DiagTest
    gpus: tuple[int, ...]
    said: tuple[str, ...]
    action: str

    @property
    def instance(self) -> str:
        """What the check name's brackets carry: ``pcie.gpu2`` (:func:`dcgm_instance`)."""
        return dcgm_instance(self.test.name, self.gpus)


def dcgm_instance(test: str, gpus: Sequence[int]) -> str:
    """``PCIe`` on GPU 2 -> ``pcie.gpu2``; GPUs 0 to 5 ``pcie.gpu0-5``, GPUs 1 and 3
    ``pcie.gpu1,gpu3``; no GPU: the test alone."""
    runs: list[list[int]] = []
    for g in sorted(set(gpus)):
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    # consecutive GPUs as a range (gpu0-5), so that a test failing everywhere stays short
    names = [f"gpu{r[0]}" if len(r) == 1 else f"gpu{r[0]}-{r[-1]}" for r in runs]
    return f"{catalogue.slug(test)}.{','.join(names)}" if names else catalogue.slug(test)


def _explanations(test: DiagTest, gpus: Sequence[int]) -> list[str]:
    """DCGM's own words for a failed test: errors and warnings (else info) naming ``gpus``."""
    said = [*test.errors, *test.warnings] or list(test.info)
    mine = [m for m in said if any(re.search(rf"\bGPU {g}\b", m) for g in gpus)]
    return list(dict.fromkeys(mine or said))


def dcgm_failures(diag: DcgmDiag) -> list[DcgmFailure]:
    """Each failed test with its GPUs (a deployment test reports none: the ones its message
    names) and its action (:func:`gpuforge.validate.catalogue.dcgm_action`)."""
    out = []
    for t in diag.failed:
        gpus = sorted({r.gpu for r in t.results if r.status == "Fail" and r.gpu is not None})
        said = _explanations(t, gpus)
        if not gpus:
            gpus = sorted({int(g) for m in said for g in re.findall(r"\bGPU (\d+)\b", m)})
        out.append(DcgmFailure(t, tuple(gpus), tuple(said), catalogue.dcgm_action(t.name, said)))
    return out


def dcgm_diag_passed(diag: DcgmDiag) -> JudgeOutcome:
    """Every DCGM diagnostic test passed or was skipped; a warning alone is ``warn_only``.

    A failure's action is the strongest its failed tests call for (an error DCGM did not tie to
    a test: the catalogue's default), the same on every path that runs the diagnostic.
    """
    failures = dcgm_failures(diag)
    warned = [t for t in diag.tests if t.status == "Warn"]
    measured = ", ".join(f"{t.name}={t.status}" for t in diag.tests)
    if failures or diag.errors:
        said = [m for f in failures for m in f.said[:2]] + list(diag.errors[:2])
        detail = "failed: " + ", ".join(f.instance for f in failures)
        actions = [f.action for f in failures] or [catalogue.DCGM_DEFAULT_ACTION]
        return JudgeOutcome(
            False,
            measured,
            "every test Pass or Skip",
            "; ".join([detail, *said]),
            action=catalogue.strongest(actions),
        )
    if warned:
        said = [m for t in warned for m in t.warnings[:2]]
        detail = "warnings: " + "; ".join(said or [t.name for t in warned])
        return JudgeOutcome(False, measured, "every test Pass or Skip", detail, warn_only=True)
    return JudgeOutcome(True, measured, "every test Pass or Skip")
