"""``gpuforge-node config check FILE``: validate a health.yaml (the health role's ``validate:``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuforge.node import config

HELP = "check a health.yaml (exit 0 valid, 2 invalid: the message names the key)"


def _say(text: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``config check FILE``."""
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="validate FILE")
    check.add_argument("file", type=Path)


def main(args: argparse.Namespace) -> int:
    """Load the file strictly; InputError (exit 2) names file, line and key."""
    loaded = config.load(args.file)
    enabled = sum(1 for name in config.CHECKS if loaded.check(name).enabled)
    _say(f"{args.file}: valid ({loaded.node}, {enabled} checks enabled, {loaded.digest})")
    return 0
