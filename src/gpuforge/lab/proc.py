"""Running the lab's non-podman tools (debootstrap, gpg, dpkg-deb, ssh-keygen) and build locks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpuforge.errors import OperationError

_TAIL = 2000


def run_cmd(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input_data: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``cmd`` with a timeout; raise OperationError naming it when it fails or hangs."""
    try:
        # Own process group, so a timeout or Ctrl-C stops the command's children too
        # (debootstrap, dpkg), not only the command itself.
        child = subprocess.Popen(
            list(cmd),
            stdin=subprocess.PIPE if input_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise OperationError(f"{cmd[0]} is not installed (make system-deps)") from exc
    try:
        out, err = child.communicate(input_data, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(child)
        raise OperationError(f"timed out after {timeout:g}s: {shlex.join(cmd)}") from exc
    except BaseException:
        _kill_group(child)
        raise
    proc = subprocess.CompletedProcess(list(cmd), child.returncode, out, err)
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
        raise OperationError(
            f"{shlex.join(cmd)} exited {proc.returncode}: {msg[-_TAIL:] or '(no output)'}"
        )
    return proc


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.communicate()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the block.

    Serialises builds that several processes may start at once (parallel Molecule scenarios,
    two engineers running ``lab up``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
