"""Every podman call gpuforge makes goes through this module.

It pins the lab's podman configuration (``lab/containers.conf`` through ``CONTAINERS_CONF``), puts
a timeout on every call and turns failures into :class:`~gpuforge.errors.OperationError` with the
command and the tail of its stderr.  Nothing here knows about topologies;
:mod:`gpuforge.lab.lifecycle` does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.errors import OperationError
from gpuforge.lab.paths import CONTAINERS_CONF

#: The label every podman object of a lab carries: ``gpuforge.lab=<labname>``.
LAB_LABEL = "gpuforge.lab"

#: Default timeout (seconds) for quick podman queries.
QUICK = 60.0

_STDERR_TAIL = 2000


def podman_env() -> dict[str, str]:
    """The environment every podman call runs with."""
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def run(
    args: Sequence[str],
    *,
    timeout: float = QUICK,
    check: bool = True,
    input_data: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``podman <args>`` and return the completed process (bytes out, bytes err).

    Raises OperationError when podman is missing, times out, or (with ``check``) exits non-zero.
    """
    cmd = ["podman", *args]
    try:
        proc = subprocess.run(
            cmd,
            input=b"" if input_data is None else input_data,  # never the caller's stdin
            capture_output=True,
            timeout=timeout,
            env=podman_env(),
            check=False,
        )
    except FileNotFoundError as exc:
        raise OperationError("podman is not installed (make system-deps)") from exc
    except subprocess.TimeoutExpired as exc:
        raise OperationError(f"timed out after {timeout:g}s: {_show(cmd)}") from exc
    if check and proc.returncode != 0:
        raise OperationError(
            f"{_show(cmd)} exited {proc.returncode}: {_tail(proc.stderr or proc.stdout)}"
        )
    return proc


def text(args: Sequence[str], *, timeout: float = QUICK) -> str:
    """Run podman and return its stdout as text, stripped."""
    return run(args, timeout=timeout).stdout.decode("utf-8", "replace").strip()


def run_json(args: Sequence[str], *, timeout: float = QUICK) -> Any:
    """Run a podman command that prints JSON and parse it (empty output means ``[]``)."""
    out = text(args, timeout=timeout)
    if not out:
        return []
    try:
        return json.loads(out)
    except json.JSONDecodeError as exc:
        raise OperationError(f"podman {args[0]} printed invalid JSON: {exc}") from exc


# --- images ----------------------------------------------------------------------------------


def image_exists(ref: str) -> bool:
    """Whether an image ``ref`` exists in local storage."""
    return run(["image", "exists", ref], check=False).returncode == 0


def image_id(ref: str) -> str:
    """The full id of a local image."""
    return text(["image", "inspect", "--format", "{{.Id}}", ref])


def tag(source: str, target: str) -> None:
    """Tag an image."""
    run(["tag", source, target])


def import_tarball(tarball: Path, ref: str, changes: Sequence[str], *, timeout: float) -> None:
    """``podman import`` a root filesystem tarball as image ``ref`` with Dockerfile ``changes``."""
    args = ["import", "--quiet"]
    for change in changes:
        args += ["--change", change]
    run([*args, str(tarball), ref], timeout=timeout)


# --- networks --------------------------------------------------------------------------------


def network_exists(name: str) -> bool:
    """Whether a podman network ``name`` exists."""
    return run(["network", "exists", name], check=False).returncode == 0


def network_create(name: str, labels: Mapping[str, str]) -> None:
    """Create a bridge network with DNS (container names resolve) carrying ``labels``."""
    args = ["network", "create", "--driver", "bridge"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    run([*args, name])


def networks(label: str) -> list[str]:
    """Names of networks carrying ``label`` (``key`` or ``key=value``)."""
    out = text(["network", "ls", "--filter", f"label={label}", "--format", "{{.Name}}"])
    return [line for line in out.splitlines() if line]


def network_rm(name: str) -> None:
    """Remove a network (no error if it is already gone)."""
    if network_exists(name):
        run(["network", "rm", "--force", name], timeout=120)


# --- containers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerInfo:
    """What ``podman ps`` tells about one container."""

    name: str
    state: str
    labels: Mapping[str, str]
    started_at: int
    image: str


def containers(label: str) -> list[ContainerInfo]:
    """All containers (running or not) carrying ``label`` (``key`` or ``key=value``)."""
    rows = run_json(["ps", "--all", "--filter", f"label={label}", "--format", "json"])
    infos = []
    for row in rows:
        names = row.get("Names") or [""]
        infos.append(
            ContainerInfo(
                name=str(names[0]),
                state=str(row.get("State", "unknown")),
                labels=dict(row.get("Labels") or {}),
                started_at=int(row.get("StartedAt") or 0),
                image=str(row.get("Image", "")),
            )
        )
    return sorted(infos, key=lambda c: c.name)


def container_exists(name: str) -> bool:
    """Whether a container ``name`` exists (in any state)."""
    return run(["container", "exists", name], check=False).returncode == 0


def inspect(name: str) -> dict[str, Any]:
    """``podman container inspect`` of one container."""
    data = run_json(["container", "inspect", name])
    if not data:
        raise OperationError(f"no container named {name}")
    return dict(data[0])


def container_address(name: str, network: str) -> str:
    """The IPv4 address of container ``name`` on ``network``."""
    nets = inspect(name).get("NetworkSettings", {}).get("Networks", {}) or {}
    address = str((nets.get(network) or {}).get("IPAddress") or "")
    if not address:
        raise OperationError(f"container {name} has no address on network {network}")
    return address


def run_container(
    name: str,
    image: str,
    *,
    hostname: str,
    network: str,
    labels: Mapping[str, str],
    volumes: Sequence[str] = (),
    extra: Sequence[str] = (),
    command: Sequence[str] = (),
    timeout: float = 180.0,
) -> str:
    """Start a detached container; returns its id."""
    args = [
        "run",
        "--detach",
        "--name",
        name,
        "--hostname",
        hostname,
        "--network",
        network,
    ]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    for volume in volumes:
        args += ["--volume", volume]
    return text([*args, *extra, image, *command], timeout=timeout)


def start(name: str, *, timeout: float = 120.0) -> None:
    """Start an existing stopped container."""
    run(["start", name], timeout=timeout)


def rm(names: Sequence[str], *, timeout: float = 120.0) -> None:
    """Force-remove containers (stopping them first; no error for missing ones)."""
    if names:
        run(["rm", "--force", "--ignore", "--time", "5", *names], timeout=timeout)


def exec_(
    name: str,
    command: Sequence[str],
    *,
    timeout: float = QUICK,
    check: bool = True,
    input_data: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` inside container ``name``."""
    args = ["exec", *(["--interactive"] if input_data is not None else []), name, *command]
    return run(args, timeout=timeout, check=check, input_data=input_data)


def put_file(name: str, data: bytes, dest: str, *, mode: str = "0644") -> None:
    """Write ``data`` to ``dest`` inside container ``name`` atomically, creating parent dirs.

    The bytes travel through ``podman cp`` from a private temporary file, never through a
    command line, so the content never shows up in process listings or error messages.
    """
    parent = str(Path(dest).parent)
    staged = f"{dest}.gpuforge-tmp"
    exec_(name, ["mkdir", "-p", parent])
    with tempfile.NamedTemporaryFile(prefix="gpuforge-put-") as tmp:
        tmp.write(data)
        tmp.flush()
        run(["cp", tmp.name, f"{name}:{staged}"], timeout=120)
    exec_(
        name,
        [
            "sh",
            "-c",
            'chmod "$1" "$2" && chown 0:0 "$2" && mv -f "$2" "$3"',
            "sh",
            mode,
            staged,
            dest,
        ],
    )


def read_file(name: str, path: str, *, timeout: float = QUICK) -> bytes:
    """The contents of ``path`` inside container ``name``."""
    return exec_(name, ["cat", path], timeout=timeout).stdout


def _show(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


def _tail(data: bytes) -> str:
    msg = data.decode("utf-8", "replace").strip()
    return msg[-_STDERR_TAIL:] if msg else "(no output)"
