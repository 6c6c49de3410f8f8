"""The node's checks: gather with the node's own tools, judge with the validators' pure functions.

Each check is a function ``(Probe) -> CheckResult``. :class:`Probe` runs every tool at most once
per run (``nvidia-smi -q -x`` serves four checks) and keeps what it gathered for the record
(counters, events). The judgement is :mod:`gpuforge.validate.checks` /
:mod:`~gpuforge.validate.flaps` / the Xid catalogue, with the names, thresholds and actions of the
check catalogue (:mod:`gpuforge.validate.catalogue`): the same the acceptance suite uses.

A tool that is missing, hangs, fails or prints what its parser cannot read makes the check ERROR
(status ``error``), never FAIL: an ERROR never drains a node.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from gpuforge.errors import InputError
from gpuforge.node import config as cfg
from gpuforge.node.commands import Output, Runner, ToolError
from gpuforge.node.record import TEXT_MAX, NodeEvent, clip
from gpuforge.node.state import State
from gpuforge.validate import catalogue, checks, flaps
from gpuforge.validate.checks import JudgeOutcome
from gpuforge.validate.parsers import (
    dcgmi,
    ibstat,
    link_events,
    nvidia_smi_csv,
    nvidia_smi_xml,
    nvlink,
    xid,
)
from gpuforge.validate.parsers.nvidia_smi_common import NvidiaSmiReport
from gpuforge.validate.result import CheckResult, Status, excerpt
from gpuforge.validate.xid_catalogue import Action, lookup

_T = TypeVar("_T")

GPU_QUERY = ["nvidia-smi", f"--query-gpu={checks.GPU_QUERY}", "--format=csv"]
XML = ["nvidia-smi", "-q", "-x"]
NVLINK = ["nvidia-smi", "nvlink", "-s"]
IBSTAT = ["ibstat"]
DPKG = list(checks.DPKG_QUERY)
#: ``systemctl is-active`` exits 3 when a unit is inactive: an answer, not a failure to run.
SYSTEMCTL_OK = (0, 3, 4)
#: Tools the passive tier starts at once (each check then reads its memo): the run takes about
#: as long as its slowest tool instead of the sum of them.
PREFETCH_WORKERS = 4
KERNEL_LOG = (
    ["dmesg", "--time-format", "iso"],
    ["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso-precise"],
)
_ISO_HEAD = re.compile(
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
)


class UnavailableError(Exception):
    """The check cannot conclude (tool missing, timed out, unreadable output)."""


def judged(
    check: str, outcome: JudgeOutcome, evidence: str, needles: Sequence[str] = ()
) -> CheckResult:
    """A pure check's :class:`JudgeOutcome` as a result: a FAIL carries the outcome's own action,
    else the check catalogue's (:func:`gpuforge.validate.catalogue.action`).

    Only a result that is not a pass carries its evidence: 12,500 nodes send a record every
    interval, and what explains a pass is its ``measured`` value. Like every node-side result,
    it leaves ``node`` empty: the record names the node.
    """
    if outcome.ok:
        return CheckResult(
            "", check, Status.PASS, outcome.measured, outcome.expected, message=outcome.detail
        )
    status = Status.WARN if outcome.warn_only else Status.FAIL
    act = catalogue.result_action(check, ok=False, warn=outcome.warn_only, named=outcome.action)
    said = f"{outcome.measured} {outcome.detail}"
    # Cut the output around what the judgement names (a GPU's bus id, a port), not head/tail.
    named = sorted({m.group(0) for m in _NEEDLE.finditer(said)})
    kept = excerpt(evidence, [*named, *needles], TEXT_MAX)
    return CheckResult(
        "",
        check,
        status,
        outcome.measured,
        outcome.expected,
        evidence=kept,
        message=outcome.detail,
        action=act,
    )


_NEEDLE = re.compile(
    r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?|\bmlx5_\d+\b|\bib\d+\b|\bGPU\s?\d+\b"
)


def error(check: str, why: str, evidence: str = "") -> CheckResult:
    """The check could not run: ERROR (never drains)."""
    return CheckResult("", check, Status.ERROR, evidence=clip(evidence), message=why)


def skip(check: str, why: str) -> CheckResult:
    """The check does not apply here (no expectation, disabled)."""
    return CheckResult("", check, Status.SKIP, message=why)


@dataclass
class Probe:
    """One run's view of the node: the config, a runner, the state and what was gathered."""

    config: cfg.HealthConfig
    runner: Runner
    state: State
    now: datetime
    tier: str
    proc_root: Path = Path("/proc")
    counters: dict[str, float] = field(default_factory=dict)
    events: list[NodeEvent] = field(default_factory=list)
    _memo: dict[str, Any] = field(default_factory=dict)

    # --- gathering (each at most once per run) ---------------------------------------------

    def _once(self, key: str, make: Callable[[], _T]) -> _T:
        if key not in self._memo:
            try:
                self._memo[key] = make()
            except (ToolError, InputError, OSError, ValueError) as exc:
                self._memo[key] = UnavailableError(_why(exc))
        value = self._memo[key]
        if isinstance(value, UnavailableError):
            raise value
        return value  # type: ignore[no-any-return]

    def output(self, argv: Sequence[str], ok: Sequence[int] = (0,)) -> Output:
        """A command's output, run once per run."""
        return self._once("$ " + " ".join(argv), lambda: self.runner.run(argv, ok=ok))

    def csv(self) -> tuple[nvidia_smi_csv.NvidiaSmiCsv, str]:
        """``nvidia-smi --query-gpu=... --format=csv``, parsed."""
        out = self.output(GPU_QUERY)
        return self._once("csv", lambda: nvidia_smi_csv.parse(out.stdout)), out.evidence()

    def xml(self) -> tuple[NvidiaSmiReport, str]:
        """``nvidia-smi -q -x``, parsed."""
        out = self.output(XML)
        return self._once("xml", lambda: nvidia_smi_xml.parse(out.stdout)), out.evidence()

    def kernel_log(self) -> str:
        """This boot's kernel log with ISO times (dmesg, else the journal)."""

        def read() -> str:
            errors = []
            for argv in KERNEL_LOG:
                try:
                    return self.runner.run(argv).stdout
                except ToolError as exc:
                    errors.append(str(exc))
            raise ToolError(KERNEL_LOG[0], "; ".join(errors))

        return self._once("kernel_log", read)

    def boot(self) -> tuple[str, datetime]:
        """This boot's identity and the kernel's boot time (``/proc``).

        The identity is the kernel's boot_id plus the start time of PID 1: on a real node both
        change only at a reboot; in a lab container (one kernel for every node) a reboot is a
        restarted container, which changes PID 1's start time alone.
        """

        def read() -> tuple[str, datetime]:
            boot_id = (self.proc_root / "sys/kernel/random/boot_id").read_text().strip()
            uptime = float((self.proc_root / "uptime").read_text().split()[0])
            try:
                stat = (self.proc_root / "1/stat").read_text().rsplit(")", 1)[1].split()
                init = stat[19]  # field 22 of proc_pid_stat(5): start time in clock ticks
            except (OSError, IndexError):
                init = ""
            return f"{boot_id}/{init}" if init else boot_id, self.now - timedelta(seconds=uptime)

        return self._once("boot", read)

    def ib_counter(self, rail: cfg.Rail, name: str) -> int:
        """A port counter from ``<sysfs_root>/class/infiniband/<dev>/ports/<port>/counters``."""
        path = self.counter_dir(rail) / name
        return self._once(str(path), lambda: int(path.read_text().strip()))

    def counter_dir(self, rail: cfg.Rail) -> Path:
        """Where the kernel exposes ``rail``'s port counters."""
        root = self.config.sysfs_root
        return root / "class/infiniband" / rail.device / "ports" / str(rail.port) / "counters"

    def prefetch(self, checks: Sequence[str]) -> None:
        """Start the tools the enabled ``checks`` need, at once; their answers go to the memo.

        Each check still asks for its tool and gets the memo (or the error it stored), so a
        prefetch changes how long a run takes, never what it finds.
        """
        wanted = set(checks)
        e = self.config.expect
        jobs: list[Callable[[], object]] = []
        if wanted & {"gpu.count", "gpu.model", "software.versions"}:
            jobs.append(lambda: self.output(GPU_QUERY))
        if wanted & {"gpu.xid", "fabric.flaps"}:
            jobs.append(self.kernel_log)
        if wanted & {"gpu.ecc_uncorrectable", "gpu.row_remap", "gpu.pcie_link", "gpu.throttle"}:
            jobs.append(lambda: self.output(XML))
        if "gpu.nvlink" in wanted and e.nvlink_links_per_gpu:
            jobs.append(lambda: self.output(NVLINK))
        if "fabric.port" in wanted and e.rails:
            jobs.append(lambda: self.output(IBSTAT))
        if "software.versions" in wanted and set(e.versions) - {"driver"}:
            jobs.append(lambda: self.output(DPKG))
        if "software.services" in wanted and e.services:
            jobs.append(lambda: self.output(_systemctl(e.services), ok=SYSTEMCTL_OK))
        if len(jobs) < 2:  # one job gains nothing from a thread
            return
        with ThreadPoolExecutor(max_workers=PREFETCH_WORKERS) as pool:
            for future in [pool.submit(job) for job in jobs]:
                with contextlib.suppress(UnavailableError):
                    future.result()

    # --- kernel log deltas --------------------------------------------------------------------

    def new_kernel_lines(self) -> tuple[list[str], str | None]:
        """Kernel-log lines newer than the passive tier's cursor, and the newest time seen.

        A new boot (another boot id) starts the cursor again. Lines without a time are new only
        when there is no cursor yet (the first run of a boot).
        """
        text = self.kernel_log()
        boot_id, _ = self.boot()
        cursor = self.state.kmsg_cursor if self.state.boot_id == boot_id else None
        since = _parse_iso(cursor) if cursor else None
        newest = since
        fresh: list[str] = []
        for line in text.splitlines():
            m = _ISO_HEAD.match(line)
            when = _parse_iso(m.group(1)) if m else None
            if when is None:
                if since is None:
                    fresh.append(line)
                continue
            if since is None or when > since:
                fresh.append(line)
            if newest is None or when > newest:
                newest = when
        return fresh, newest.isoformat() if newest else cursor

    def gpu_of_pci(self) -> dict[str, int]:
        """``{pci bus (lower case, without domain padding): GPU index}`` when nvidia-smi answers."""
        try:
            csv, _ = self.csv()
        except UnavailableError:
            return {}
        out = {}
        for i, row in enumerate(csv.rows):
            bus = (row.value("pci.bus_id") or "").lower()
            if bus:
                out[_short_pci(bus)] = int(row.value("index") or i)
        return out


def _why(exc: BaseException) -> str:
    if isinstance(exc, ToolError):
        return str(exc)
    if isinstance(exc, InputError):
        return f"unreadable output: {exc}"
    if isinstance(exc, OSError):
        return f"cannot read {exc.filename or ''}: {exc.strerror or exc}".replace("  ", " ")
    return f"unreadable: {exc}"


def _parse_iso(text: str) -> datetime | None:
    stamp = text.replace(",", ".").replace("Z", "+00:00")
    stamp = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", stamp)
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _short_pci(bus: str) -> str:
    """``00000000:91:00.0`` / ``PCI:0000:91:00`` -> ``91:00`` (bus:device, what Xid lines carry)."""
    bus = bus.lower().removeprefix("pci:")
    parts = bus.split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus


def guarded(check: str, body: Callable[[], CheckResult]) -> CheckResult:
    """Run ``body``; what it could not gather is this check's ERROR."""
    try:
        return body()
    except UnavailableError as exc:
        return error(check, str(exc))


# --- GPU ------------------------------------------------------------------------------------


def gpu_count(p: Probe) -> CheckResult:
    """As many GPUs as the node type declares (one missing: fallen off the bus -> reboot)."""
    want = p.config.expect.gpus
    if want is None:
        return skip("gpu.count", "expect.gpus not set")

    def body() -> CheckResult:
        csv, ev = p.csv()
        return judged("gpu.count", checks.gpu_count(csv, want), ev)

    return guarded("gpu.count", body)


def gpu_model(p: Probe) -> CheckResult:
    """Every GPU is the declared model."""
    want = p.config.expect.gpu_model
    if not want:
        return skip("gpu.model", "expect.gpu_model not set")

    def body() -> CheckResult:
        csv, ev = p.csv()
        return judged("gpu.model", checks.gpu_models(csv, want), ev)

    return guarded("gpu.model", body)


def gpu_xid(p: Probe, *, advance: bool) -> CheckResult:
    """Xids since the last passive run, plus those kept until a reboot (sticky, :func:`_sticky`).

    ``advance``: this run moves the kernel-log cursor and the sticky list (the passive tier);
    the prolog and the epilog only look at what is newer than the cursor.
    """

    def body() -> CheckResult:
        boot_id, _ = p.boot()
        if p.state.boot_id != boot_id:
            # A reboot clears what the driver reported before it (every draining Xid's action
            # includes at least a GPU reset, which a reboot performs).
            p.state.sticky_xids = []
        fresh, newest = p.new_kernel_lines()
        new_text = "\n".join(fresh)
        report = xid.read(new_text)
        _xid_events(p, report)
        fresh_xids = xid.with_lines(new_text, report)
        sticky = list(p.state.sticky_xids)
        for e, line in fresh_xids:
            entry = lookup(e.xid)
            if _sticky(entry.action) and not entry.user_caused and line not in sticky:
                sticky.append(line)
        fallen = [ln.strip() for ln in fresh if "fallen off the bus" in ln]
        sticky += [ln for ln in fallen if ln not in sticky]
        if advance:
            p.state.sticky_xids = sticky[-50:]
            p.state.kmsg_cursor = newest
            p.state.boot_id = boot_id
        watch = [line for _, line in fresh_xids if line not in sticky]
        text = "\n".join(sticky + watch)
        outcome = checks.no_hardware_xids(text)
        return judged("gpu.xid", outcome, text or "no Xid since the last run")

    return guarded("gpu.xid", body)


def _sticky(action: Action) -> bool:
    """Xids kept until a reboot: those whose repair is a reboot or a person (reboot, inspect,
    rma). A ``reset_gpu`` Xid is judged once: what it leaves behind (a pending row remap, an
    uncorrectable ECC count) stays visible to its own check until the reset."""
    return action.rank >= Action.REBOOT.rank


def _xid_events(p: Probe, report: xid.XidReport | None) -> None:
    if report is None:
        return
    gpus = p.gpu_of_pci()
    for e in report.xids:
        gpu = gpus.get(_short_pci(e.pci))
        p.events.append(
            NodeEvent("xid", e.timestamp, gpu, e.xid, clip(f"{e.name}: {e.message}", 300))
        )
    for s in report.sxids:
        p.events.append(
            NodeEvent("sxid", s.timestamp, None, s.sxid, clip(f"{s.switch}: {s.message}", 300))
        )


def gpu_ecc(p: Probe) -> CheckResult:
    """No uncorrectable ECC error since the driver loaded (catalogue action of Xid 48)."""

    def body() -> CheckResult:
        report, ev = p.xml()
        for i, g in enumerate(report.gpus):
            v = g.ecc_volatile
            if v is not None:
                p.counters[f"gpu/{i}/ecc_dbe_volatile"] = (v.sram_uncorrectable or 0) + (
                    v.dram_uncorrectable or 0
                )
                p.counters[f"gpu/{i}/ecc_sbe_volatile"] = (v.sram_correctable or 0) + (
                    v.dram_correctable or 0
                )
        outcome = checks.no_uncorrectable_ecc(report)
        return judged("gpu.ecc_uncorrectable", outcome, ev, ("uncorrectable>",))

    return guarded("gpu.ecc_uncorrectable", body)


def gpu_row_remap(p: Probe) -> CheckResult:
    """No pending row remap (Xid 63's action) and no remap failure (Xid 64's)."""

    def body() -> CheckResult:
        report, ev = p.xml()
        outcome = checks.row_remap_healthy(report)
        return judged(
            "gpu.row_remap",
            outcome,
            ev,
            ("<remapped_row_pending>", "<remapped_row_failure>", "<pending_retirement>"),
        )

    return guarded("gpu.row_remap", body)


def gpu_nvlink(p: Probe) -> CheckResult:
    """Every GPU has its declared NVLink links up (Xid 74's action when not)."""
    links = p.config.expect.nvlink_links_per_gpu
    if not links:
        return skip("gpu.nvlink", "expect.nvlink_links_per_gpu not set (no NVLink declared)")

    def body() -> CheckResult:
        out = p.output(NVLINK)
        status = p._once("nvlink", lambda: nvlink.parse(out.stdout))
        gpus = p.config.expect.gpus or len(status.gpus)
        outcome = checks.nvlink_all_up(status, gpus=gpus, links_per_gpu=links)
        return judged("gpu.nvlink", outcome, out.evidence())

    return guarded("gpu.nvlink", body)


def gpu_pcie(p: Probe) -> CheckResult:
    """Every GPU's PCIe link at the declared generation and width (a reseat when not)."""

    def body() -> CheckResult:
        report, ev = p.xml()
        e = p.config.expect
        outcome = checks.pcie_link(report, gen=e.pcie_gen, width=e.pcie_width)
        return judged("gpu.pcie_link", outcome, ev)

    return guarded("gpu.pcie_link", body)


def gpu_throttle(p: Probe) -> CheckResult:
    """No clock event reason but idle, application clocks or power cap (thermal, HW slowdown)."""

    def body() -> CheckResult:
        report, ev = p.xml()
        return judged("gpu.throttle", checks.no_throttling(report), ev)

    return guarded("gpu.throttle", body)


# --- fabric -----------------------------------------------------------------------------------


def _rails(p: Probe, layer: str | None = None) -> list[cfg.Rail]:
    return [r for r in p.config.expect.rails if layer is None or r.link_layer == layer]


def fabric_port(p: Probe) -> CheckResult:
    """Each rail's port Active/LinkUp at its rate and link layer (``ibstat``)."""
    rails = _rails(p)
    if not rails:
        return skip("fabric.port", "no rail declared")

    def body() -> CheckResult:
        out = p.output(IBSTAT)
        report = p._once("ibstat", lambda: ibstat.parse(out.stdout))
        specs = [{"device": r.device, "rate_gbps": r.rate_gbps or 0} for r in rails]
        results = []
        for rail, spec in zip(rails, specs, strict=True):
            results += checks.ib_ports(
                report, [spec], rate_gbps=rail.rate_gbps or 0, link_layer=rail.link_layer
            )
        return _combine("fabric.port", results, out.evidence())

    return guarded("fabric.port", body)


def _combine(check: str, parts: Sequence[tuple[str, JudgeOutcome]], evidence: str) -> CheckResult:
    bad = [(name, o) for name, o in parts if not o.ok and not o.warn_only]
    warn = [(name, o) for name, o in parts if not o.ok and o.warn_only]
    measured = "; ".join(f"{name}: {o.measured}" for name, o in parts)
    expected = "; ".join(sorted({str(o.expected) for _, o in parts}))
    detail = "; ".join(f"{name}: {o.detail}" for name, o in bad + warn if o.detail)
    ok = not bad and not warn
    outcome = JudgeOutcome(ok, measured, expected, detail, warn_only=bool(warn) and not bad)
    return judged(check, outcome, evidence)


def fabric_mtu(p: Probe) -> CheckResult:
    """Each rail's netdev MTU as declared (``<sysfs_root>/class/net/<netdev>/mtu``)."""
    rails = [r for r in _rails(p) if r.mtu and r.netdev]
    if not rails:
        return skip("fabric.mtu", "no rail declares an mtu and a netdev")

    def body() -> CheckResult:
        parts = []
        seen = []
        for r in rails:
            path = p.config.sysfs_root / "class/net" / str(r.netdev) / "mtu"
            got = p._once(str(path), lambda path=path: int(path.read_text().strip()))  # type: ignore[misc]
            seen.append(f"{path}: {got}")
            outcome = checks.mtu_matches(got, int(r.mtu or 0), link_layer=r.link_layer)
            parts.append((str(r.netdev), outcome))
        return _combine("fabric.mtu", parts, "\n".join(seen))

    return guarded("fabric.mtu", body)


def _window_delta(p: Probe, key: str, value: float, window_s: float) -> float:
    """How much a counter grew within ``window_s`` (a reset restarts from zero)."""
    now = p.now.timestamp()
    samples = [s for s in p.state.counters.get(key, []) if now - s[0] <= window_s]
    if samples and value < samples[-1][1]:
        samples = [[now - 1e-3, 0.0]]  # the counter was reset (reboot, driver reload)
    base = samples[0][1] if samples else value
    samples.append([now, value])
    # Keep the window's first sample and the newest ones: enough for the delta, bounded.
    p.state.counters[key] = [samples[0], *samples[1:][-50:]] if len(samples) > 1 else samples
    return value - base


def fabric_counters(p: Probe, *, record_samples: bool = True) -> CheckResult:
    """IB port error counters' growth within ``window_s`` against per-counter maxima."""
    rails = _rails(p, "InfiniBand")
    if not rails:
        return skip("fabric.counters", "no InfiniBand rail declared")
    params = p.config.check("fabric.counters").params
    window = float(params["window_s"])
    maxima: Mapping[str, int] = params["max"]

    def body() -> CheckResult:
        deltas: dict[str, float] = {}
        for r in rails:
            for name in cfg.COUNTER_NAMES:
                key = f"ib/{r.device}/{r.port}/{name}"
                value = p.ib_counter(r, name)
                p.counters[key] = value
                if record_samples:
                    deltas[key] = _window_delta(p, key, value, window)
                else:
                    last = p.state.counters.get(key, [])
                    deltas[key] = value - last[-1][1] if last and value >= last[-1][1] else 0
        outcome = checks.counter_growth(deltas, maxima, window_s=window)
        evidence = "\n".join(f"{k} = {p.counters[k]:g} (+{d:g})" for k, d in deltas.items())
        return judged("fabric.counters", outcome, evidence)

    return guarded("fabric.counters", body)


def fabric_flaps(p: Probe) -> CheckResult:
    """Per rail: down/up cycles within ``window_h`` (flap), a port down longer than ``down_s``."""
    rails = [r for r in _rails(p) if r.netdev]
    if not rails:
        return skip("fabric.flaps", "no rail declares a netdev")
    params = p.config.check("fabric.flaps").params

    def body() -> CheckResult:
        _, boot = p.boot()
        events = link_events.parse(p.kernel_log(), now=p.now, boot=boot)
        parts = []
        evidence = [e.text for e in events if e.netdev in {r.netdev for r in rails}]
        for r in rails:
            downed = None
            if r.link_layer == "InfiniBand":
                try:
                    downed = p.ib_counter(r, "link_downed")
                except UnavailableError:
                    downed = None  # fabric.counters reports the missing counters
            outcome = flaps.judge_port(
                events, str(r.netdev), now=p.now, boot=boot, link_downed=downed, params=params
            )
            parts.append((str(r.netdev), outcome))
        return _combine("fabric.flaps", parts, "\n".join(evidence) or "no link down/up line")

    return guarded("fabric.flaps", body)


_PAUSE = re.compile(r"^\s*(?:rx|tx)_prio\d_pause:\s*(\d+)\s*$", re.MULTILINE)


def fabric_roce_pfc(p: Probe) -> CheckResult:
    """RoCE rails: PFC pause frames (``ethtool -S``) within ``window_s`` against ``max_pause``."""
    rails = [r for r in _rails(p, "Ethernet") if r.netdev]
    if not rails:
        return skip("fabric.roce_pfc", "no RoCE rail with a netdev declared")
    params = p.config.check("fabric.roce_pfc").params

    def body() -> CheckResult:
        deltas: dict[str, float] = {}
        evidence = []
        for r in rails:
            out = p.output(["ethtool", "-S", str(r.netdev)])
            found = [int(v) for v in _PAUSE.findall(out.stdout)]
            if not found:
                raise UnavailableError(f"ethtool -S {r.netdev}: no rx/tx_prio<N>_pause counter")
            key = f"roce/{r.netdev}/pause_frames"
            p.counters[key] = sum(found)
            _ecn_counters(p, r)
            deltas[key] = _window_delta(p, key, sum(found), float(params["window_s"]))
            evidence.append(f"{key} = {sum(found)} (+{deltas[key]:g})")
        limit = {k: int(params["max_pause"]) for k in deltas}
        outcome = checks.counter_growth(deltas, limit, window_s=float(params["window_s"]))
        if not outcome.ok:
            outcome = JudgeOutcome(
                False, outcome.measured, outcome.expected, outcome.detail, warn_only=True
            )
        return judged("fabric.roce_pfc", outcome, "\n".join(evidence))

    return guarded("fabric.roce_pfc", body)


#: mlx5's congestion counters (``ports/<port>/hw_counters``): ECN-marked packets received
#: (notification point) and CNPs handled (reaction point). Reported in the record, not judged:
#: ECN marks are the congestion control working.
ECN_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled")


def _ecn_counters(p: Probe, rail: cfg.Rail) -> None:
    folder = p.counter_dir(rail).with_name("hw_counters")
    for name in ECN_COUNTERS:
        try:
            p.counters[f"roce/{rail.device}/{name}"] = int((folder / name).read_text().strip())
        except (OSError, ValueError):
            continue  # not every HCA or kernel exposes them


# --- software ---------------------------------------------------------------------------------


def software_versions(p: Probe) -> CheckResult:
    """Installed versions against the pins (driver from nvidia-smi, the rest from dpkg)."""
    pins = p.config.expect.versions
    if not pins:
        return skip("software.versions", "expect.versions not set")

    def body() -> CheckResult:
        measured: dict[str, str | None] = {}
        evidence = []
        if "driver" in pins:
            csv, ev = p.csv()
            found = sorted({str(r.value("driver_version")) for r in csv.rows})
            measured["driver"] = ",".join(found) or None
            evidence.append(ev)
        if set(pins) - {"driver"}:
            out = p.output(DPKG)
            installed = checks.parse_installed(out.stdout)
            evidence.append(out.evidence())
            for key in sorted(set(pins) - {"driver"}):
                names = catalogue.VERSION_PACKAGES[key]
                measured[key] = checks.package_version(installed, names, pins[key])
        outcome = checks.pinned_versions(measured, pins)
        return judged("software.versions", outcome, "\n".join(evidence))

    return guarded("software.versions", body)


def _systemctl(services: Sequence[str]) -> list[str]:
    return ["systemctl", "is-active", *services]


def software_services(p: Probe) -> CheckResult:
    """Every declared service active (``systemctl is-active``)."""
    services = p.config.expect.services
    if not services:
        return skip("software.services", "expect.services not set")

    def body() -> CheckResult:
        # is-active exits 3 when a unit is inactive: an answer, not a failure to run.
        out = p.output(_systemctl(services), ok=SYSTEMCTL_OK)
        states = [s.strip() for s in out.stdout.splitlines() if s.strip()]
        if len(states) != len(services):
            raise UnavailableError(
                f"systemctl is-active printed {len(states)} states for {len(services)} units"
            )
        outcome = checks.services_active(dict(zip(services, states, strict=True)))
        return judged("software.services", outcome, out.evidence())

    return guarded("software.services", body)


# --- the node itself -----------------------------------------------------------------------------


def node_clock(p: Probe) -> CheckResult:
    """The node's clock against the collector's, as the last delivery measured it (state.json).

    Gathers nothing itself: each answer of the collector carries its clock and the delivery
    keeps the offset, so this works with or without an NTP client (lab containers have none).
    No measurement yet, or only an old one: SKIP (never ERROR: the node is not at fault).
    """
    if p.config.collector is None:
        return skip("node.clock", "no collector configured: no clock to compare with")
    sample = p.state.clock
    if sample is None:
        return skip("node.clock", "not measured yet: the collector's next answer carries its clock")
    params = p.config.check("node.clock").params
    age = p.now.timestamp() - sample.at
    if abs(age) > float(params["max_age_s"]):
        return skip(
            "node.clock",
            f"the last measurement is {age:.0f} s old (max_age_s {params['max_age_s']}): "
            "the collector has not answered since",
        )
    outcome = checks.clock_offset(sample.offset_s, sample.rtt_s, warn_s=float(params["warn_s"]))
    try:
        measured_at = datetime.fromtimestamp(sample.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # a date no calendar shows: the number
        measured_at = f"{sample.at:.0f}"
    evidence = (
        f"collector_time - node time = {sample.offset_s:+.3f} s (round trip {sample.rtt_s:.3f} s)"
        f", measured at {measured_at} (node clock) on the collector's answer"
    )
    return judged("node.clock", outcome, evidence)


# --- epilog -------------------------------------------------------------------------------------


#: ``dcgmi diag`` levels the node runs: the epilog ``-r 1`` (~30 s on 8 GPUs), the nightly
#: conformance task's burnin level ``-r 2`` (its own budget: ``DCGM_BUDGET_S``).
DCGM_BUDGET_S = {1: 60.0, 2: 900.0}


def gpu_dcgm_diag(p: Probe, level: int = 1) -> CheckResult:
    """``dcgmi diag -r <level> -j``: any failed test fails, with the action the check catalogue
    gives what failed (:func:`gpuforge.validate.checks.dcgm_diag_passed`, the acceptance
    burn-in's judge too); warnings alone WARN."""

    def body() -> CheckResult:
        # dcgmi exits non-zero when a test fails: the JSON says which.
        out = p.output(["dcgmi", "diag", "-r", str(level), "-j"], ok=tuple(range(256)))
        diag = p._once(f"dcgmi-{level}", lambda: dcgmi.parse(out.stdout or out.stderr))
        if not diag.completed:
            raise UnavailableError("; ".join(diag.errors) or "dcgmi could not run the diagnostic")
        outcome = checks.dcgm_diag_passed(diag)
        return judged("gpu.dcgm_diag", outcome, out.evidence())

    return guarded("gpu.dcgm_diag", body)


#: The checks of each tier, in run order (cheap and decisive first).
PASSIVE: dict[str, Callable[[Probe], CheckResult]] = {
    "gpu.count": gpu_count,
    "gpu.model": gpu_model,
    "gpu.xid": lambda p: gpu_xid(p, advance=True),
    "gpu.ecc_uncorrectable": gpu_ecc,
    "gpu.row_remap": gpu_row_remap,
    "gpu.nvlink": gpu_nvlink,
    "gpu.pcie_link": gpu_pcie,
    "gpu.throttle": gpu_throttle,
    "fabric.port": fabric_port,
    "fabric.mtu": fabric_mtu,
    "fabric.counters": fabric_counters,
    "fabric.flaps": fabric_flaps,
    "fabric.roce_pfc": fabric_roce_pfc,
    "software.versions": software_versions,
    "software.services": software_services,
    "node.clock": node_clock,
}
PROLOG: dict[str, Callable[[Probe], CheckResult]] = {
    "gpu.xid": lambda p: gpu_xid(p, advance=False),
    "fabric.counters": lambda p: fabric_counters(p, record_samples=False),
}
EPILOG: dict[str, Callable[[Probe], CheckResult]] = {
    "gpu.xid": lambda p: gpu_xid(p, advance=False),
    "gpu.ecc_uncorrectable": gpu_ecc,
    "gpu.row_remap": gpu_row_remap,
    "gpu.dcgm_diag": gpu_dcgm_diag,
}
TIERS = {"passive": PASSIVE, "prolog": PROLOG, "epilog": EPILOG}
