"""Burn-in: DCGM diagnostics, gpu-burn and ib_write_bw per rail, judged from the tools' output.

Every function takes a :class:`~gpuforge.command.CommandRunner` and returns
:class:`~gpuforge.validate.result.CheckResult` values; a hang is a ``fail`` with evidence, an
unreachable node or unreadable output is an ``error`` (the node is held, not drained).
gpu-burn's exit status is never trusted: it exits 0 with FAULTY GPUs.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuforge.command import CommandResult, CommandRunner
from gpuforge.validate import catalogue, checks
from gpuforge.validate.parsers import dcgmi, gpu_burn, ib_write_bw
from gpuforge.validate.result import CheckResult, Level, Status, excerpt
from gpuforge.validate.thresholds import ib_write_bw_floor_gbps

#: Seconds ``dcgmi diag -r N`` may take (roles/dcgm defaults ``dcgm_diag_timeouts``).
DCGM_TIMEOUTS = {1: 120, 2: 600, 3: 3600, 4: 14400}
#: First TCP port of the perftest out-of-band exchange; each rail and round uses a later one.
PERFTEST_PORT = 18515


def dcgm_level(*, new_or_repaired: bool) -> int:
    """``-r 3`` (targeted stress, power, memory bandwidth) for new or repaired hardware, else 2."""
    return 3 if new_or_repaired else 2


def _base(node: str, check: str, res: CommandResult) -> dict[str, Any]:
    return {
        "node": node,
        "check": check,
        "evidence": res.evidence(),
        "duration_s": res.duration_s,
        "level": Level.BURNIN,
    }


def _not_concluded(node: str, check: str, res: CommandResult, expected: str) -> CheckResult | None:
    """The result for a hang (fail) or an unreachable node (error); None when the tool ran."""
    if res.timed_out:
        return CheckResult(
            status=Status.FAIL,
            measured="hung",
            expected=expected,
            message=f"did not finish within its timeout: {res.command}",
            **_base(node, check, res),
        )
    if res.unreachable:
        return CheckResult(
            status=Status.ERROR,
            expected=expected,
            message="node unreachable",
            **_base(node, check, res),
        )
    return None


#: The one DCGM check (the epilog's and the nightly burnin's too); a failed test is an instance.
DCGM_CHECK = "gpu.dcgm_diag"


def dcgm_check_name(test: str, gpus: Sequence[int]) -> str:
    """The check name of a failed DCGM test: ``PCIe`` on GPU 2 -> ``gpu.dcgm_diag[pcie.gpu2]``.

    GPUs 0 to 5 -> ``[pcie.gpu0-5]``; GPUs 1 and 3 -> ``[pcie.gpu1,gpu3]``.
    """
    return f"{DCGM_CHECK}[{checks.dcgm_instance(test, gpus)}]"


def _needles(messages: Sequence[str], raw: str) -> list[str]:
    """Strings that find each message in the raw output: JSON escapes it, the table wraps it."""
    out = []
    for m in messages:
        head = m[:40]
        out.append(head if head in raw else json.dumps(m)[1:41])
    return out


def dcgm_diag(runner: CommandRunner, node: str, *, level: int) -> list[CheckResult]:
    """``dcgmi diag -r <level> -j``: one ``fail`` per failed test, named by test and GPU.

    A failed test becomes ``gpu.dcgm_diag[<test>.gpuN]`` (what the Slurm reason and the report
    show), with DCGM's explanation as the message, the evidence cut around it and the action the
    check catalogue gives that test (:func:`gpuforge.validate.checks.dcgm_failures`, the judge
    the node's epilog and the nightly burnin use). Without a failed test the run is one
    ``gpu.dcgm_diag`` result: pass, warn on warnings, fail on an error DCGM did not tie to a
    test, error (held) when it could not run.
    """
    check = DCGM_CHECK
    expected = f"every test Pass or Skip in dcgmi diag -r {level}"
    res = runner.run(node, f"dcgmi diag -r {level} -j", timeout=DCGM_TIMEOUTS.get(level, 3600))
    early = _not_concluded(node, check, res, expected)
    if early:
        return [early]
    try:
        diag = dcgmi.parse(res.stdout or res.stderr)
    except Exception as exc:  # unreadable output is inconclusive
        return [
            CheckResult(
                status=Status.ERROR,
                expected=expected,
                message=f"unreadable dcgmi output: {exc}",
                **_base(node, check, res),
            )
        ]
    if not diag.completed:
        return [
            CheckResult(
                status=Status.ERROR,
                measured="not completed",
                expected=expected,
                message="; ".join(diag.errors) or "dcgmi could not run the diagnostic",
                **_base(node, check, res),
            )
        ]
    raw = res.evidence()
    failed: list[CheckResult] = []
    for f in checks.dcgm_failures(diag):
        t = f.test
        on = f" on GPU {','.join(str(g) for g in f.gpus)}" if f.gpus else ""
        failed.append(
            CheckResult(
                node=node,
                check=f"{check}[{f.instance}]",
                status=Status.FAIL,
                measured=f"{t.category} / {t.name}: Fail{on}",
                expected=f"Pass in dcgmi diag -r {level}",
                evidence=excerpt(
                    raw, [f'"{t.name}"', f"| {t.name} ", *_needles(f.said, raw), *diag.errors[:2]]
                ),
                duration_s=res.duration_s,
                level=Level.BURNIN,
                message=("; ".join(f.said) or f"DCGM gave no explanation for {t.name}")[:500],
                action=f.action,
            )
        )
    if failed:
        return failed
    outcome = checks.dcgm_diag_passed(diag)
    warned = [t.name for t in diag.tests if t.status == "Warn"]
    if diag.errors:
        status, measured = Status.FAIL, "; ".join(diag.errors)
    elif warned:
        status, measured = Status.WARN, "warn: " + ", ".join(warned)
    else:
        status, measured = Status.PASS, f"{len(diag.tests)} tests passed"
    said = [m for t in diag.tests if t.status == "Warn" for m in (*t.errors, *t.warnings)]
    return [
        CheckResult(
            node=node,
            check=check,
            status=status,
            measured=measured,
            expected=expected,
            evidence=excerpt(raw, [*_needles(said, raw), *diag.errors[:2]]),
            duration_s=res.duration_s,
            level=Level.BURNIN,
            message="; ".join([*diag.errors, *said])[:500],
            action=catalogue.result_action(
                check, ok=outcome.ok, warn=outcome.warn_only, named=outcome.action
            ),
        )
    ]


def gpu_burn_command(seconds: int, binary: str = "gpu_burn", *, doubles: bool = False) -> str:
    """gpu-burn needs its ``compare.ptx`` next to it: run from its own directory."""
    args = f"{'-d ' if doubles else ''}{int(seconds)}"
    return f'cd "$(dirname "$(command -v {binary})")" && {binary} {args}'


def gpu_burn_check(
    runner: CommandRunner,
    node: str,
    *,
    seconds: int,
    gpus: int,
    min_gflops: float | None = None,
    binary: str = "gpu_burn",
) -> list[CheckResult]:
    """Run gpu-burn; per-GPU verdicts from its summary, plus the slowest GPU's Gflop/s."""
    check = "burnin.gpu_burn"
    expected = f"{gpus} GPUs OK, 0 errors"
    res = runner.run(node, gpu_burn_command(seconds, binary), timeout=seconds + 180)
    early = _not_concluded(node, check, res, expected)
    if early:
        return [early]
    try:
        burn = gpu_burn.parse(res.stdout)
    except Exception as exc:  # crashed before printing anything readable
        status = Status.FAIL if res.rc not in (0, None) else Status.ERROR
        msg = f"exit {res.rc}, unreadable output: {exc}"
        return [
            CheckResult(status=status, expected=expected, message=msg, **_base(node, check, res))
        ]
    if not burn.complete:
        status = Status.FAIL if res.rc not in (0, None) else Status.ERROR
        return [
            CheckResult(
                status=status,
                measured=f"incomplete at {burn.last_progress_percent}%",
                expected=expected,
                message=f"no 'Tested N GPUs' summary (exit {res.rc})",
                **_base(node, check, res),
            )
        ]
    bad = [
        f"GPU {g.index}: {g.verdict}" + (f" errors={g.errors}" if g.errors else "")
        for g in burn.gpus
        if g.verdict != "OK" or g.errors
    ]
    if (burn.tested or len(burn.gpus)) != gpus:
        bad.append(f"tested {burn.tested} GPUs")
    out = [
        CheckResult(
            status=Status.FAIL if bad else Status.PASS,
            measured="; ".join(bad) or f"{len(burn.gpus)} OK",
            expected=expected,
            message="FAULTY GPUs (gpu-burn exits 0 regardless)" if bad else "",
            action=catalogue.result_action(check, ok=not bad, warn=False),
            **_base(node, check, res),
        )
    ]
    rates = {g.index: g.gflops for g in burn.gpus if g.gflops is not None}
    if rates:
        slowest = min(rates, key=lambda i: rates[i])
        low = rates[slowest]
        ok = min_gflops is None or low >= min_gflops
        expected_text = "no SKU floor: the peer comparison judges it"
        message = ""
        if min_gflops is not None:
            expected_text = f">= {min_gflops:g} Gflop/s (SKU floor)"
            if not ok:
                short = 1 - low / min_gflops
                message = f"GPU {slowest}: {low:g} Gflop/s, {short:.0%} below the SKU floor"
        out.append(
            CheckResult(
                node=node,
                check="burnin.gpu_burn.min_gflops",
                status=Status.PASS if ok else Status.FAIL,
                measured=round(low, 1),
                expected=expected_text,
                evidence=", ".join(f"GPU {i}: {v}" for i, v in rates.items()),
                duration_s=res.duration_s,
                level=Level.BURNIN,
                message=message,
                action=catalogue.result_action("burnin.gpu_burn", ok=ok, warn=False),
            )
        )
    return out


# --- ib_write_bw between pairs ----------------------------------------------------------------


@dataclass(frozen=True)
class RailPair:
    """One ib_write_bw test: ``server`` and ``client`` on the same rail."""

    rail: int
    server: str
    server_device: str
    server_address: str  # where the client reaches the server's out-of-band TCP port
    client: str
    client_device: str
    port: int = PERFTEST_PORT


@dataclass(frozen=True)
class PairResult:
    """What one pair measured."""

    pair: RailPair
    gbps: float
    server: CommandResult
    client: CommandResult
    problem: str = ""

    def evidence(self) -> str:
        """Both sides' output."""
        return (
            f"[server {self.pair.server}]\n{self.server.evidence()}\n"
            f"[client {self.pair.client}]\n{self.client.evidence()}"
        )


def ib_write_bw_pair(
    runner: CommandRunner,
    pair: RailPair,
    *,
    seconds: int = 10,
    timeout: float = 90.0,
    settle_s: float = 2.0,
) -> PairResult:
    """Server on one node, client on the other, both under hard timeouts; Gb/s measured."""
    common = f"-p {pair.port} -D {seconds} -F --report_gbits -q 4"
    server_cmd = f"ib_write_bw -d {pair.server_device} {common}"
    client_cmd = f"ib_write_bw -d {pair.client_device} {common} {shlex.quote(pair.server_address)}"
    box: dict[str, CommandResult] = {}

    def serve() -> None:
        box["server"] = runner.run(pair.server, server_cmd, timeout=timeout)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    time.sleep(settle_s)  # let the server listen before the client connects
    client = runner.run(pair.client, client_cmd, timeout=timeout)
    thread.join(timeout + 30)
    server = box.get(
        "server", CommandResult(pair.server, server_cmd, None, "", "no result", 0.0, True)
    )
    if client.timed_out or server.timed_out:
        return PairResult(pair, 0.0, server, client, "hung")
    if client.unreachable or server.unreachable:
        return PairResult(pair, -1.0, server, client, "unreachable")
    try:
        gbps = ib_write_bw.parse(client.stdout).max_bw_average_gbps
    except Exception as exc:  # no table: the test failed to run
        return PairResult(pair, 0.0, server, client, f"no result: {exc}")
    return PairResult(pair, gbps, server, client)


def ib_write_bw_rail(
    run_pair: Callable[[RailPair], PairResult],
    nodes: Sequence[str],
    *,
    rate_gbps: float,
    make_pair: Callable[[str, str, int], RailPair],
    max_rounds: int = 6,
    references: Sequence[str] = (),
) -> list[CheckResult]:
    """Test ``nodes`` on one rail in rounds of disjoint pairs, and name the slow ones.

    Round 1 pairs neighbours. A pair that reaches the floor clears both nodes. A pair below the
    floor says only that one side is slow, so each member of it is paired again, in the next
    round, with a node that has passed (or, while none has, with another untested or
    unresolved node it has not met yet): below the floor with a node that passed, it fails;
    at the floor, it is cleared. Rounds stop when every node is resolved, when no new pair can
    be formed, or after ``max_rounds``. A node still unresolved is an error (held, not drained):
    nothing it was paired with could tell which side was slow. ``make_pair(server, client,
    round)`` builds a pair; each node is in at most one pair per round.

    ``references`` are nodes already admitted (known good, idle): they count as passed from the
    start, so an odd node out is paired with one in round 1 and a node whose batch partners all
    fell below the floor meets one next; batch nodes that passed are asked first. References get
    no result of their own.
    """
    floor = ib_write_bw_floor_gbps(rate_gbps)
    known = [r for r in references if r not in set(nodes)]
    cleared: dict[str, PairResult] = {}  # node -> a result at the floor
    below: dict[str, list[PairResult]] = {n: [] for n in [*nodes, *known]}
    met: set[frozenset[str]] = set()

    def partner(r: PairResult, node: str) -> str:
        return r.pair.client if r.pair.server == node else r.pair.server

    def good(node: str) -> bool:
        return node in cleared or node in known

    def condemning(node: str) -> PairResult | None:
        """A result below the floor with a partner that passed elsewhere (or is admitted)."""
        hits = [r for r in below[node] if r.gbps >= 0 and good(partner(r, node))]
        return hits[0] if hits else None

    def unresolved() -> list[str]:
        return [n for n in nodes if n not in cleared and condemning(n) is None]

    pairs = [make_pair(nodes[i], nodes[i + 1], 1) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and known:
        pairs.append(make_pair(known[0], nodes[-1], 1))
    for round_no in range(1, max_rounds + 1):
        if not pairs:
            break
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(pairs)))) as pool:
            for r in pool.map(run_pair, pairs):
                met.add(frozenset((r.pair.server, r.pair.client)))
                for node in (r.pair.server, r.pair.client):
                    if r.gbps >= floor:
                        cleared.setdefault(node, r)
                    else:
                        below[node].append(r)
        refs = [n for n in cleared if n not in known] + known
        pairs = _next_pairs(unresolved(), refs, met, round_no + 1, make_pair)

    out: list[CheckResult] = []
    for node in nodes:
        if node in cleared:
            r = cleared[node]
            msg = f"at the floor with {partner(r, node)}" if below[node] else ""
            out.append(_ib_result(node, r, floor, Status.PASS, msg))
        elif (r_bad := condemning(node)) is not None:
            mate = partner(r_bad, node)
            how = (
                f"which reached it with {partner(cleared[mate], mate)}"
                if mate in cleared
                else "an admitted node"
            )
            msg = f"below the floor with {mate}, {how}"
            out.append(_ib_result(node, r_bad, floor, Status.FAIL, msg))
        elif below[node]:
            r = below[node][-1]
            msg = r.problem if r.gbps < 0 else "below the floor; no partner that passed to tell"
            out.append(_ib_result(node, r, floor, Status.ERROR, msg))
        else:
            out.append(
                CheckResult(
                    node=node,
                    check="burnin.ib_write_bw",
                    status=Status.ERROR,
                    expected=f">= {floor:g} Gb/s",
                    level=Level.BURNIN,
                    message="no partner to test with",
                )
            )
    return out


def _next_pairs(
    todo: Sequence[str],
    references: Sequence[str],
    met: set[frozenset[str]],
    round_no: int,
    make_pair: Callable[[str, str, int], RailPair],
) -> list[RailPair]:
    """Disjoint pairs for the next round: each node to resolve with a new reference if possible."""
    busy: set[str] = set()
    pairs = []
    for node in todo:
        if node in busy:
            continue
        candidates = [*references, *todo]
        mate = next(
            (
                c
                for c in candidates
                if c != node and c not in busy and frozenset((node, c)) not in met
            ),
            None,
        )
        if mate is not None:
            busy |= {node, mate}
            pairs.append(make_pair(mate, node, round_no))
    return pairs


def _ib_result(node: str, r: PairResult, floor: float, status: Status, msg: str) -> CheckResult:
    device = r.pair.server_device if r.pair.server == node else r.pair.client_device
    return CheckResult(
        node=node,
        check=f"burnin.ib_write_bw[{device}]",
        status=status,
        measured=round(r.gbps, 1) if r.gbps >= 0 else None,
        expected=f">= {floor:g} Gb/s",
        evidence=r.evidence(),
        duration_s=max(r.client.duration_s, r.server.duration_s),
        level=Level.BURNIN,
        message=msg or r.problem,
    )


def node_min(results: Sequence[CheckResult], prefix: str, check: str) -> list[CheckResult]:
    """Per node, the lowest numeric ``measured`` over checks starting with ``prefix``."""
    low: dict[str, float] = {}
    for r in results:
        if r.check.startswith(prefix) and isinstance(r.measured, int | float):
            low[r.node] = min(low.get(r.node, float("inf")), float(r.measured))
    return [
        CheckResult(node=n, check=check, status=Status.PASS, measured=v, level=Level.BURNIN)
        for n, v in sorted(low.items())
    ]


# --- fabric.counters across the validation ---------------------------------------------------

#: Where the kernel exposes an HCA port's error counters (the node checker's ``fabric.counters``),
#: below the node's sysfs root (``/sys``; the inventory's ``health_sysfs_root``, as the node
#: checker's ``sysfs_root``).
COUNTER_DIR = "{root}/class/infiniband/{device}/ports/{port}/counters"
_COUNTER_LINE = re.compile(r"^.*/class/infiniband/([^/]+)/ports/(\d+)/counters/(\w+):(\d+)\s*$")


@dataclass(frozen=True)
class CounterSample:
    """One node's IB port error counters at one moment: ``{ib/<dev>/<port>/<name>: value}``,
    or why they could not be read."""

    node: str
    at: float
    values: dict[str, int]
    evidence: str = ""
    error: str = ""


def counter_command(devices: Sequence[str], port: int = 1, *, sysfs_root: str = "/sys") -> str:
    """One ``grep -H`` over every counter of ``devices`` (``path:value`` lines)."""
    root = sysfs_root.rstrip("/")
    paths = [
        f"{COUNTER_DIR.format(root=root, device=d, port=port)}/{name}"
        for d in devices
        for name in catalogue.COUNTER_NAMES
    ]
    return "grep -H . " + " ".join(shlex.quote(p) for p in paths)


def parse_counter_sample(text: str) -> dict[str, int]:
    """``path:value`` lines -> ``{ib/<dev>/<port>/<name>: value}`` (other lines ignored)."""
    out = {}
    for line in text.splitlines():
        m = _COUNTER_LINE.match(line.strip())
        if m:
            out[f"ib/{m[1]}/{m[2]}/{m[3]}"] = int(m[4])
    return out


def sample_counters(
    runner: CommandRunner,
    node: str,
    devices: Sequence[str],
    *,
    now: Callable[[], float],
    sysfs_root: str = "/sys",
) -> CounterSample:
    """Read ``devices``' port 1 error counters on ``node`` (one SSH command, 30 s at most)."""
    res = runner.run(node, counter_command(devices, sysfs_root=sysfs_root), timeout=30)
    values = parse_counter_sample(res.stdout)
    want = {f"ib/{d}/1/{n}" for d in devices for n in catalogue.COUNTER_NAMES}
    missing = sorted(want - set(values))
    error = ""
    if res.timed_out or res.unreachable:
        error = "counters not read: " + ("timed out" if res.timed_out else "node unreachable")
    elif missing:
        error = f"counters not readable: {', '.join(missing[:4])}" + (
            f" (+{len(missing) - 4})" if len(missing) > 4 else ""
        )
    return CounterSample(node, now(), values, res.evidence(), error)


def counter_results(
    before: CounterSample, after: CounterSample, *, level: Level, maxima: Mapping[str, int]
) -> CheckResult:
    """``fabric.counters`` over the validation: the node checker's judge, growth from before
    burn-in to after the last level (a counter that went down was reset: from zero)."""
    check = "fabric.counters"
    node = before.node
    if before.error or after.error:
        return CheckResult(
            node,
            check,
            Status.ERROR,
            expected="counters readable before and after",
            evidence=after.evidence if after.error else before.evidence,
            level=level,
            message=before.error or after.error,
        )
    deltas = {
        key: float(value - before.values[key] if value >= before.values[key] else value)
        for key, value in after.values.items()
        if key in before.values
    }
    window = max(after.at - before.at, 0.0)
    outcome = checks.counter_growth(deltas, maxima, window_s=window)
    evidence = "\n".join(
        f"{k} = {after.values[k]} (+{d:g} since before burn-in)" for k, d in sorted(deltas.items())
    )
    return CheckResult(
        node,
        check,
        Status.PASS if outcome.ok else Status.FAIL,
        measured=outcome.measured,
        expected=outcome.expected,
        evidence=evidence,
        duration_s=window,
        level=level,
        message=outcome.detail,
        action=catalogue.result_action(check, ok=outcome.ok, warn=False, named=outcome.action),
    )
