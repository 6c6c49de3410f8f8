"""``python3 gpuforge-node.pyz <command>``: the node checker's command line.

Commands are registered in :data:`COMMANDS` (name -> module). A command module defines
``add_arguments(parser)`` and ``main(args) -> int``; helper G's ``conformance`` adds one line
there. Exit statuses: 0 success, 1 a check failed (see each command), 2 bad input or usage; a
one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpuforge.errors import GpuforgeError

#: Command name -> module implementing it (``add_arguments``, ``main``, ``HELP``).
COMMANDS: dict[str, str] = {
    "health": "gpuforge.node.cli_health",
    "config": "gpuforge.node.cli_config",
    "conformance": "gpuforge.node.cli_conformance",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"gpuforge-node: {message}\n")


def _say(text: str, *, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    top = _Parser(prog="gpuforge-node", description="gpuforge node health checker")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; errors are one line on stderr."""
    args = parser().parse_args(argv)
    try:
        return int(args._main(args))
    except GpuforgeError as exc:
        _say(f"gpuforge-node: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
