"""``gpuforge-node health passive|prolog|epilog [--config FILE]``: run a tier on this node.

Exit status (docs/health.md, "Exit status"): ``passive`` 0 on any verdict (slurmd ignores
HealthCheckProgram's status; the collector drains), 2 when the config cannot be read;
``prolog`` 1 only when the job must not start here (a non-zero Prolog drains the node and
requeues the job; for a new Xid only with the collector's consent, see
:func:`gpuforge.node.engine.prolog_consent`), 0 otherwise; ``epilog`` 0 (a non-zero Epilog would
drain behind the circuit breaker). prolog and epilog exit 0 with one line on any error of the
checker or its config (a check that cannot run never drains).
``health clear CHECK`` forgets a check's sticky evidence and streak (after a GPU reset).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuforge.errors import InputError, OperationError
from gpuforge.node import config as cfg
from gpuforge.node import engine
from gpuforge.node import state as st

HELP = "run a health tier (passive, prolog, epilog) or clear a check's state"
#: Environment overrides (tests, the lab): where /proc is read from.
PROC_ENV = "GPUFORGE_NODE_PROC"
CONFIG_ENV = "GPUFORGE_HEALTH_CONFIG"


def _say(text: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``health TIER [--config FILE]`` and ``health clear CHECK``."""
    parser.add_argument("tier", choices=("passive", "prolog", "epilog", "clear"))
    parser.add_argument("check", nargs="?", help="with clear: the check to forget (gpu.xid)")
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get(CONFIG_ENV) or cfg.DEFAULT_PATH),
        help=f"health.yaml (default {cfg.DEFAULT_PATH})",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")


#: What a prolog or epilog that could not judge leaves the job and node to (one line, exit 0).
_ALLOWED = {"prolog": "job allowed", "epilog": "node not drained"}


def _not_judged(tier: str, what: str, exc: BaseException) -> int:
    """One line naming the checker's own failure; 0 (a non-zero Prolog/Epilog drains)."""
    text = " ".join(str(exc).split())[:500] or type(exc).__name__
    if not isinstance(exc, InputError):
        text = f"{type(exc).__name__}: {text}"
    _say(f"gpuforge-node: health {tier}: {what}: {text}: {_ALLOWED[tier]}", err=True)
    return 0


def main(args: argparse.Namespace) -> int:
    """Run the tier; print one summary line.

    prolog and epilog exit 0 on any error of the checker itself or its config, with one line
    (``gpuforge-node: health prolog: config error: ...: job allowed``): a non-zero Prolog or
    Epilog drains the node behind the collector's circuit breaker.
    """
    if args.tier not in _ALLOWED:
        return _main(args)
    try:
        config = cfg.load(args.config)
    except Exception as exc:  # any: a broken config must not drain the node
        return _not_judged(args.tier, "config error", exc)
    try:
        return _main(args, config)
    except Exception as exc:  # any: a broken checker must not drain the node
        return _not_judged(args.tier, "checker error", exc)


def _main(args: argparse.Namespace, config: cfg.HealthConfig | None = None) -> int:
    if config is None:
        try:
            config = cfg.load(args.config)
        except InputError:
            raise
        except Exception as exc:  # any other: a bug of the loader
            # A bug of the loader: one line, exit 1 (passive never drains by itself).
            raise OperationError(f"{args.config}: {type(exc).__name__}: {exc}") from None
    if args.tier == "clear":
        return _clear(config, args.check)
    if args.check:
        raise InputError(f"health {args.tier}: unexpected argument {args.check!r}")
    try:
        result = engine.run_tier(
            config,
            args.tier,
            proc_root=Path(os.environ.get(PROC_ENV) or "/proc"),
            job_id=engine.job_id_from_env() if args.tier != "passive" else None,
        )
    except Exception as exc:
        # A non-zero Prolog/Epilog drains the node: a checker that broke (a full disk, a bug)
        # must not. The message names what broke; passive reports it as an operation failure.
        if args.tier in _ALLOWED:
            return _not_judged(args.tier, "checker error", exc)
        _say(f"gpuforge-node: health {args.tier}: {type(exc).__name__}: {exc}", err=True)
        return 0 if args.tier in ("prolog", "epilog") else 1
    record = result.record
    if not args.quiet or result.exit_code:
        bad = [
            f"{c.check}={c.status}" for c in record.checks if c.status in ("fail", "error", "warn")
        ]
        req = record.request.to_dict() if record.request else None
        sent = "" if result.delivery is None else f", sent {result.delivery.sent}"
        why = f" ({result.delivery.error})" if result.delivery and result.delivery.error else ""
        _say(
            f"gpuforge-node health {record.tier}: {record.verdict} in {record.duration_s:.2f} s"
            f"{': ' + ', '.join(bad) if bad else ''}; request {req}{sent}{why}"
        )
    if result.note:
        _say(f"gpuforge-node: {result.note}", err=True)
    return result.exit_code


def _clear(config: cfg.HealthConfig, check: str | None) -> int:
    if check not in cfg.CHECKS:
        raise InputError(f"health clear: unknown check {check!r} (one of {', '.join(cfg.CHECKS)})")
    path = config.state_dir / "state.json"
    state = st.load(path)
    state.streaks.pop(check, None)
    if check == "gpu.xid":
        state.sticky_xids = []
    st.save(path, state)
    _say(f"gpuforge-node: {check}: streak and sticky evidence cleared")
    return 0
