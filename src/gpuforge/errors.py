"""The one exception hierarchy; the CLI maps ``exit_code`` to the process exit status.

Exit codes: 0 success, 1 a check or operation failed, 2 bad input or usage.
"""

from __future__ import annotations


class GpuforgeError(Exception):
    """Root of every error gpuforge raises on purpose."""

    exit_code = 1


class InputError(GpuforgeError):
    """Bad input: a broken spec, file or argument. Nothing was written."""

    exit_code = 2


class OperationError(GpuforgeError):
    """An operation (a command, a play, a container) failed."""

    exit_code = 1


class Interrupted(OperationError):  # noqa: N818 - reads as the outcome it reports
    """The operator stopped gpuforge (Ctrl-C or SIGTERM); what ran was recorded as interrupted."""

    exit_code = 130
