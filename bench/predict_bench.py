"""Benchmark: ``fleet risk`` on fleets of two independent generators, several seeds each.

1. The tuning generator (:mod:`gpuforge.predict.generate`), at scale: 2,000 nodes x 30 days.
2. The held-out generator (:mod:`gpuforge.predict.generate_heldout`), written apart from the
   scorer: 128 nodes x 14 days, one sample per 6 h, nine failures a week, decoys. The scorer's
   constants were not set on it; its figures are the ones that say whether the ranking holds.

For both: precision@k and recall@k (k = the failures within 7 days), decoys in the top k, the
nodes scored >= 0.5 (what a drain policy may drain), the facility findings, and the reliability
of the score per bin (mean score against the share that failed), pooled over the seeds.

Not a test: prints a table. Each seed runs in a fresh subprocess (peak memory, ru_maxrss, is that
run's alone). A fleet is 2,000 nodes x 8 GPUs x 8 IB ports, one sample per 5 minutes per metric
(13 metrics: 11 per GPU, 2 per port) over 30 days: about 1.9 billion samples. Written as JSON
Lines that is some 200 GB, so the scored path generates each node straight into the scorer's
feature accumulator (:class:`gpuforge.predict.score.FleetFeatures`, the same code that scores a
telemetry file); the JSON Lines path (write, read, score) is timed separately on a subset of nodes
and its rate stated. The scorer's time is the feature extraction plus the fleet scoring; the
generator's time is reported apart.

Scored against the generator's truth: "fails within 7 days of the end of the telemetry". For
k = the number of such nodes and for the set scored >= 0.5 (what --drain-top may drain), the
precision and recall, and every false alarm by its cause. Figures are reported per seed and as
the spread (min / median / max); the thresholds are the scorer's defaults, not tuned to a seed.
Environment: ``SEEDS`` (default 5), ``NODES`` (2000), ``DAYS`` (30), ``HELDOUT_SEEDS`` (5).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1800
SEEDS = int(os.environ.get("SEEDS", "5"))
NODES = int(os.environ.get("NODES", "2000"))
DAYS = float(os.environ.get("DAYS", "30"))
JSONL_NODES = 1
JSONL_DAYS = 7.0
DRAIN_SCORE = 0.5
HORIZON_S = 7 * 86400.0
HELDOUT_SEEDS = int(os.environ.get("HELDOUT_SEEDS", "5"))


def _cause(truth: object, fleet_at: float) -> str:
    kind = getattr(truth, "kind", "")
    mode = getattr(truth, "mode", "")
    fail = getattr(truth, "fail_time", None)
    if kind == "degrading" and fail is not None and fail > fleet_at + HORIZON_S:
        return f"degrading ({mode}), fails after 7 d"
    if kind in ("spike", "steady_high"):
        return f"{kind} ({mode})"
    facility = getattr(truth, "facility", "")
    return f"healthy, {facility} event" if facility else kind


def _child(seed: int) -> None:
    """In the subprocess: generate, score, evaluate one seed; one JSON line on stdout."""
    from gpuforge.predict.generate import FleetSpec, GeneratedFleet  # noqa: PLC0415 - timed import
    from gpuforge.predict.score import FleetFeatures, score  # noqa: PLC0415
    from gpuforge.predict.signals import Window  # noqa: PLC0415

    fleet = GeneratedFleet(FleetSpec(nodes=NODES, days=DAYS, seed=seed))
    window = Window(fleet.spec.at)
    features = FleetFeatures(window)
    events = []
    t_gen = t_feat = 0.0
    samples = 0
    for name in fleet.names:
        t0 = time.perf_counter()
        blocks, node_events = fleet.node(name)
        t1 = time.perf_counter()
        for metric, subjects, t, x in blocks:
            features.add(name, metric, subjects, t, x)
            samples += x.size
        t_feat += time.perf_counter() - t1
        t_gen += t1 - t0
        events += node_events
    t0 = time.perf_counter()
    events.sort(key=lambda e: e.time)
    report = score(features, events, fleet.labels, horizon_s=HORIZON_S)
    t_score = time.perf_counter() - t0
    positives = fleet.fails_within(HORIZON_S)
    visible = {n for n in positives if (fleet.truth[n].onset or fleet.spec.at) < fleet.spec.at}
    ranked = [r for r in report.ranked if r.score > 0]
    k = len(positives)
    top_k = [r.node for r in ranked[:k]]
    flagged = [r.node for r in ranked if r.score >= DRAIN_SCORE]

    def causes(nodes: list[str]) -> dict[str, int]:
        return dict(Counter(_cause(fleet.truth[n], fleet.spec.at) for n in nodes))

    missed = Counter(
        (fleet.truth[n].mode or fleet.truth[n].kind) + ("" if n in visible else ", no sign yet")
        for n in positives - set(flagged)
    )
    out: dict[str, Any] = {
        "bins": _bins(report, positives),
        "seed": seed,
        "samples": samples,
        "t_gen": t_gen,
        "t_feat": t_feat,
        "t_score": t_score,
        "positives": k,
        "visible": len(visible),
        "hits_k": len(set(top_k) & positives),
        "flagged": len(flagged),
        "hits_flagged": len(set(flagged) & positives),
        "false_k": causes([n for n in top_k if n not in positives]),
        "false_flagged": causes([n for n in flagged if n not in positives]),
        "missed": dict(missed),
        "facility": [f"{g.kind} {g.scope} {g.group}" for g in report.groups],
        "truth_facility": len(fleet.cooling) + len(fleet.fabric),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if seed == 0:
        out["jsonl"] = _jsonl_path(seed)
    sys.stdout.write(json.dumps(out) + "\n")


def _bins(report: Any, positives: set[str]) -> list[list[float]]:
    """Reliability bins of one fleet: [nodes, score sum, failed] per bin."""
    from gpuforge.predict.calibration import add_to_bins, new_bins  # noqa: PLC0415

    bins = new_bins()
    for r in report.ranked:
        add_to_bins(bins, r.score, r.node in positives)
    return [[b.nodes, b.score_sum, b.failed] for b in bins]


def _heldout_child() -> None:
    """In a subprocess: every held-out seed, generated and scored; one JSON line per seed."""
    from gpuforge.predict.calibration import evaluate  # noqa: PLC0415 - child only
    from gpuforge.predict.generate_heldout import HeldoutFleet, HeldoutSpec  # noqa: PLC0415
    from gpuforge.predict.score import FleetFeatures, score  # noqa: PLC0415
    from gpuforge.predict.signals import Window  # noqa: PLC0415

    for seed in range(HELDOUT_SEEDS):
        t0 = time.perf_counter()
        fleet = HeldoutFleet(HeldoutSpec(seed=seed))
        blocks = {name: fleet.node(name) for name in fleet.names}
        t1 = time.perf_counter()
        features = FleetFeatures(Window(fleet.at))
        samples = 0
        for name, (series, _) in blocks.items():
            for metric, subjects, t, x in series:
                features.add(name, metric, subjects, t, x)
                samples += x.size
        report = score(features, [], fleet.labels, horizon_s=HORIZON_S)
        t2 = time.perf_counter()
        positives = fleet.fails_within(HORIZON_S)
        result = evaluate(report, positives, decoys=fleet.decoys(), threshold=DRAIN_SCORE)
        top = [r.node for r in report.ranked[: result.k]]
        cooling = [g.group for g in report.groups if g.kind == "cooling"]
        row = {
            "seed": seed,
            "samples": samples,
            "t_gen": t1 - t0,
            "t_score": t2 - t1,
            "k": result.k,
            "p_k": result.precision_at_k,
            "r_k": result.recall_at_k,
            "decoys_k": result.decoys_at_k,
            "decoy_kinds": [fleet.truth[n].kind for n in top if n in fleet.decoys()],
            "flagged": result.flagged,
            "p_flag": result.precision_flagged,
            "r_flag": result.recall_flagged,
            "missed": [
                f"{fleet.truth[n].mode} {fleet.truth[n].subject}" for n in positives - set(top)
            ],
            "facility_kept": fleet.cooling_rack in cooling,
            "facility_extra": [g for g in cooling if g != fleet.cooling_rack],
            "bins": [[b.nodes, b.score_sum, b.failed] for b in result.bins],
        }
        sys.stdout.write(json.dumps(row) + "\n")


def _jsonl_path(seed: int) -> dict[str, Any]:
    """Write, read and score a small generated telemetry file: the file path's rate."""
    from gpuforge.predict.generate import FleetSpec, GeneratedFleet  # noqa: PLC0415 - child only
    from gpuforge.predict.score import score_telemetry  # noqa: PLC0415
    from gpuforge.predict.signals import Window  # noqa: PLC0415
    from gpuforge.predict.telemetry import read_telemetry, write_telemetry  # noqa: PLC0415

    small = GeneratedFleet(FleetSpec(nodes=JSONL_NODES, days=JSONL_DAYS, seed=seed))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "subset.jsonl"
        t0 = time.perf_counter()
        with path.open("w", encoding="utf-8") as handle:
            lines = write_telemetry(small.telemetry(), handle)
        t1 = time.perf_counter()
        telemetry = read_telemetry(path)
        t2 = time.perf_counter()
        score_telemetry(telemetry, Window(small.spec.at))
        t3 = time.perf_counter()
        return {
            "nodes": JSONL_NODES,
            "days": JSONL_DAYS,
            "lines": lines,
            "mb": path.stat().st_size / 1e6,
            "write_s": t1 - t0,
            "read_s": t2 - t1,
            "score_s": t3 - t2,
        }


def _child_lines(args: list[str], what: str) -> list[dict[str, Any]]:
    """Run this file with ``args`` in a fresh process; its JSON lines."""
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return [dict(json.loads(line)) for line in proc.stdout.strip().splitlines()]


def _run_heldout() -> list[dict[str, Any]]:
    return _child_lines(["--heldout"], "held-out fleets")


def _print_bins(title: str, rows: list[dict[str, Any]]) -> None:
    from gpuforge.predict.calibration import BINS  # noqa: PLC0415 - printing only

    print(f"{title}: reliability per score bin, pooled over the seeds")  # noqa: T201
    for i, (lo, hi) in enumerate(itertools.pairwise(BINS)):
        nodes = sum(int(r["bins"][i][0]) for r in rows)
        total = sum(float(r["bins"][i][1]) for r in rows)
        failed = sum(int(r["bins"][i][2]) for r in rows)
        mean = f"{total / nodes:.2f}" if nodes else "  - "
        seen = f"{failed / nodes:.2f}" if nodes else "  - "
        close = "]" if hi == BINS[-1] else ")"
        print(  # noqa: T201
            f"  [{lo:.2f}, {hi:.2f}{close} nodes {nodes:>6}  mean score {mean}  "
            f"failed within 7 d {seen} ({failed})"
        )


def _heldout_table(rows: list[dict[str, Any]]) -> None:
    print(  # noqa: T201
        "held-out generator (gpuforge.predict.generate_heldout; the scorer was not tuned on it):"
        f" 128 nodes x 14 days, 1 sample per 6 h, {len(rows)} seeds"
    )
    print(  # noqa: T201
        f"{'seed':>4} {'scorer s':>8} {'gen s':>6} {'k':>3} {'P@k':>5} {'R@k':>5} {'decoys@k':>8}"
        f" {'>=0.5':>5} {'P':>5} {'R':>5} {'facility':>8}  missed / decoys in the top k"
    )
    for r in rows:
        p_flag = "-" if r["p_flag"] is None else f"{r['p_flag']:.2f}"
        facility = "kept" if r["facility_kept"] else "MISSED"
        if r["facility_extra"]:
            facility += f"+{len(r['facility_extra'])}"
        notes = ", ".join(r["missed"] + r["decoy_kinds"]) or "-"
        print(  # noqa: T201
            f"{r['seed']:>4} {r['t_score']:>8.2f} {r['t_gen']:>6.2f} {r['k']:>3} "
            f"{r['p_k']:>5.2f} {r['r_k']:>5.2f} {r['decoys_k']:>8} {r['flagged']:>5} "
            f"{p_flag:>5} {r['r_flag']:>5.2f} {facility:>8}  {notes}"
        )
    p_k = [float(r["p_k"]) for r in rows]
    print(  # noqa: T201
        f"spread min/median/max: P@k {_spread(p_k, '.2f')}; decoys in the top k "
        f"{_spread([float(r['decoys_k']) for r in rows], '.0f')}"
    )
    _print_bins("held-out", rows)


def _run(seed: int) -> dict[str, Any]:
    return _child_lines(["--child", str(seed)], f"seed {seed}")[-1]


def _spread(values: list[float], fmt: str) -> str:
    return (
        f"{format(min(values), fmt)} / {format(statistics.median(values), fmt)} / "
        f"{format(max(values), fmt)}"
    )


def _ratio(a: Any, b: Any) -> float:
    return float(a) / float(b) if float(b) else 0.0


def main() -> None:
    """Run every seed of both generators and print the tables."""
    _heldout_table(_run_heldout())
    print()  # noqa: T201
    rows = [_run(seed) for seed in range(SEEDS)]
    if not rows:
        return
    print(  # noqa: T201 - a benchmark prints
        f"tuning generator (gpuforge.predict.generate): {NODES} nodes x {DAYS:g} days, "
        "8 GPUs + 8 IB ports per node, 1 sample per "
        f"5 min per metric ({int(rows[0]['samples']) / 1e9:.2f} G samples), {SEEDS} seeds"
    )
    header = (
        f"{'seed':>4} {'scorer s':>9} {'(feat+score)':>13} {'gen s':>6} {'peak MB':>8} "
        f"{'fail<=7d':>8} {'visible':>7} {'P@k=R@k':>7} {'>=0.5':>5} {'P':>5} {'R':>5}"
    )
    print(header)  # noqa: T201
    for r in rows:
        scorer = float(r["t_feat"]) + float(r["t_score"])
        k = int(r["positives"])
        print(  # noqa: T201
            f"{r['seed']:>4} {scorer:>9.1f} {float(r['t_feat']):>6.1f}+{float(r['t_score']):<6.1f}"
            f" {float(r['t_gen']):>6.1f} {float(r['peak_mb']):>8.0f} {k:>8} {r['visible']:>7} "
            f"{_ratio(r['hits_k'], k):>7.2f} {r['flagged']:>5} "
            f"{_ratio(r['hits_flagged'], r['flagged']):>5.2f} {_ratio(r['hits_flagged'], k):>5.2f}"
        )
    scorer_s = [float(r["t_feat"]) + float(r["t_score"]) for r in rows]
    p_flag = [_ratio(r["hits_flagged"], r["flagged"]) for r in rows]
    r_flag = [_ratio(r["hits_flagged"], r["positives"]) for r in rows]
    r_visible = [_ratio(r["hits_flagged"], r["visible"]) for r in rows]
    p_k = [_ratio(r["hits_k"], r["positives"]) for r in rows]
    print(f"spread min/median/max: scorer {_spread(scorer_s, '.1f')} s; "  # noqa: T201
          f"P@k=R@k {_spread(p_k, '.2f')}; score>=0.5: precision {_spread(p_flag, '.2f')}, "
          f"recall {_spread(r_flag, '.2f')} (of failures with a sign before the end: "
          f"{_spread(r_visible, '.2f')})")  # fmt: skip
    false: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    for r in rows:
        false.update(r["false_flagged"])
        missed.update(r["missed"])
    print(  # noqa: T201
        f"false alarms scored >= 0.5, all seeds: {dict(false.most_common()) or 'none'}"
    )
    print(f"failures within 7 d not flagged, all seeds: {dict(missed.most_common())}")  # noqa: T201
    facility = sum(len(r["facility"]) for r in rows)
    truth = sum(int(r["truth_facility"]) for r in rows)
    print(  # noqa: T201
        f"facility findings: {facility} reported, {truth} generated (cooling racks, fabric leaves)"
    )
    _print_bins("tuning generator", rows)
    jsonl = rows[0].get("jsonl")
    if isinstance(jsonl, dict):
        lines = int(jsonl["lines"])
        rate = lines / (jsonl["read_s"] + jsonl["score_s"])
        full = lines / (JSONL_NODES * jsonl["days"]) * NODES * DAYS
        print(  # noqa: T201
            f"JSON Lines path ({jsonl['nodes']} node x {jsonl['days']:g} d): {lines} lines, "
            f"{jsonl['mb']:.0f} MB; write {jsonl['write_s']:.1f} s, read {jsonl['read_s']:.1f} s, "
            f"score {jsonl['score_s']:.1f} s = {rate / 1e3:.0f} k lines/s read+score. The full "
            f"fleet would be {full / 1e9:.1f} G lines (~{full / rate / 3600:.0f} h): a file is "
            "for exchange and small fleets; fleets are scored from arrays"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(int(sys.argv[2]))
    elif sys.argv[1:] == ["--heldout"]:
        _heldout_child()
    else:
        main()
