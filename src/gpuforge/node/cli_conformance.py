"""``gpuforge-node conformance --level L``: one task of the nightly conformance job array.

Runs the passive tier's checks (read-only: the health streaks are not touched), compares the
node with the desired state its roles recorded (:mod:`gpuforge.node.drift`), adds DCGM level 2
at ``burnin``, and hands back one record of tier ``conformance``: written to
``last-conformance.json``, spooled and POSTed to the collector like every record (what cannot
be sent goes with the next run), and printed on stdout (the SSH path reads it there). Exit 0
whatever the verdict (the controller judges), 2 when the config cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from gpuforge.node import config as cfg
from gpuforge.node import drift, engine, output
from gpuforge.node import state as st
from gpuforge.node.commands import Budget, Runner
from gpuforge.node.probes import DCGM_BUDGET_S, TIERS, Probe, gpu_dcgm_diag, skip
from gpuforge.node.record import from_dict
from gpuforge.textfile import write

HELP = "one nightly conformance task: passive checks, drift, one record to the collector"
#: The passive checks' share of the task (they have their own 10 s budget on a lab node).
PASSIVE_BUDGET_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``conformance --level L [--config FILE] [--expected-dir DIR] [--no-send]``."""
    parser.add_argument("--level", choices=drift.LEVELS, default="quick")
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("GPUFORGE_HEALTH_CONFIG") or cfg.DEFAULT_PATH),
        help=f"health.yaml (default {cfg.DEFAULT_PATH})",
    )
    parser.add_argument("--expected-dir", type=Path, default=drift.EXPECTED_DIR)
    parser.add_argument("--no-send", action="store_true", help="print the record, send nothing")


def main(args: argparse.Namespace) -> int:
    """Run the task (module docstring)."""
    config = cfg.load(args.config)
    started = datetime.now(UTC)
    clock = time.monotonic()
    budget = Budget(PASSIVE_BUDGET_S)
    state = st.load(config.state_dir / "state.json")
    proc_root = Path(os.environ.get("GPUFORGE_NODE_PROC") or "/proc")
    probe = Probe(config, Runner(budget), state, started, "passive", proc_root=proc_root)
    results = [
        check(probe) if config.check(name).enabled else skip(name, engine.DISABLED)
        for name, check in TIERS["passive"].items()
    ]
    checks, _ = engine.hysteresis(results, config, state, update=False)
    report = drift.run(args.expected_dir)
    extra = []
    if args.level == "burnin":
        # The epilog's DCGM check at level 2, under its own budget (one judge, one action).
        dcgm = Probe(config, Runner(Budget(DCGM_BUDGET_S[2])), state, started, "conformance")
        extra = [gpu_dcgm_diag(dcgm, level=2)]
    raw = drift.conformance_record(
        config.node,
        args.level,
        started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        duration_s=time.monotonic() - clock,
        passive=checks,
        report=report,
        firmware_versions=drift.firmware(config.sysfs_root),
        job_id=os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or None,
        extra=extra,
    )
    record = from_dict(raw, "conformance record")
    output.write_last(config, record)
    write(config.textfile_dir / "gpuforge_conformance.prom", drift.metrics_text(raw, time.time()))
    sent = "not sent"
    if not args.no_send:
        output.spool(config, record, state)
        delivery = output.deliver(config, deadline=time.monotonic() + 10.0)
        sent = f"sent {delivery.sent}" + (f" ({delivery.error})" if delivery.error else "")
    sys.stdout.write(json.dumps(raw, separators=(",", ":")) + "\n")
    sys.stderr.write(
        f"gpuforge-node conformance {args.level}: {record.verdict}, "
        f"{len(report.items)} drift item(s), {sent}\n"
    )
    return 0
