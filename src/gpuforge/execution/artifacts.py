"""Bounded artifacts: what of a shard's event stream is kept on disk.

Kept in full: the run's summary (``status``, ``rc``, the ``playbook_on_stats`` event), every
failed, unreachable and changed task result, and the play/task start events (a few hundred
bytes each; they say where a failure happened). Dropped: the bodies of ``ok`` and ``skipped``
results, ansible-runner's verbose ``stdout`` transcript, the job's ``env/``, and the worker's
copy of the inventory. The per-host counts still come from the stats event, so nothing the
record needs is lost. :func:`measure` says how many bytes a run kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Target bytes kept per host per run (``GPUFORGE_ARTIFACT_BYTES_PER_HOST`` overrides it).
DEFAULT_BYTES_PER_HOST = 50_000
_KEPT_EVENTS = frozenset(
    {
        "runner_on_failed",
        "runner_on_unreachable",
        "runner_item_on_failed",
        "playbook_on_stats",
        "playbook_on_play_start",
        "playbook_on_start",
    }
)
_CHANGED_EVENTS = frozenset({"runner_on_ok", "runner_item_on_ok", "runner_on_async_ok"})
#: What a slimmed changed event keeps of ansible-runner's envelope and of its ``event_data``:
#: the rest (playbook, play and task uuids, task path, remote address...) is ~1 kB an event,
#: more than a first deploy's ~80 changed tasks per node can afford within the bound.
_SLIM_ENVELOPE = ("counter", "event")
_SLIM_DATA = ("host", "role", "task", "task_action", "duration")
#: Characters of a slimmed result's message kept.
SLIM_MESSAGE = 200
#: Bytes per host left out of a shard's budget for the run's record (``shards.json``: the
#: host's counts, a failure's message, its share of the attempts).
RECORD_RESERVE = 1_000
#: Files ansible-runner writes that a bounded run does not keep.
DROPPED_FILES = ("stdout", "command", "fact_cache")


def bytes_per_host_budget() -> int:
    """The configured target, bytes per host per run."""
    raw = os.environ.get("GPUFORGE_ARTIFACT_BYTES_PER_HOST")
    return int(raw) if raw and raw.isdigit() else DEFAULT_BYTES_PER_HOST


def keep_event(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is written to the artifact directory."""
    kind = event.get("event")
    if kind in _KEPT_EVENTS:
        return True
    if kind in _CHANGED_EVENTS:
        res = (event.get("event_data") or {}).get("res") or {}
        return bool(isinstance(res, Mapping) and res.get("changed"))
    return False


def prune(artifact_dir: Path) -> None:
    """Drop what :func:`keep_event` does not keep from a finished shard's artifact directory.

    The worker sends its artifact directory back at the end of a run; this removes what it
    holds beyond the bound (its transcript, and events a worker of another version wrote).
    """
    for name in DROPPED_FILES:
        path = artifact_dir / name
        if path.is_file():
            path.unlink()
        elif path.is_dir():
            for child in sorted(path.rglob("*"), reverse=True):
                child.unlink() if child.is_file() else child.rmdir()
            path.rmdir()
    events = artifact_dir / "job_events"
    if not events.is_dir():
        return
    for path in events.iterdir():
        try:
            keep = path.suffix == ".json" and keep_event(json.loads(path.read_text()))
        except (OSError, ValueError):
            keep = False
        if not keep:
            path.unlink()


def measure(root: Path) -> int:
    """Bytes of the files under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def enforce(artifact_dir: Path, budget: int) -> bool:
    """Slim changed events, largest first, until ``artifact_dir`` holds ``budget`` bytes at most.

    A slimmed event keeps its counter, host, role, task, action and duration, ``changed`` and
    the first :data:`SLIM_MESSAGE` characters of its message (~250 bytes); failed and
    unreachable events and the stats are never touched (they are what a person reads after a
    failed run). Returns whether anything was slimmed.
    """
    total = measure(artifact_dir)
    if total <= budget:
        return False
    events = artifact_dir / "job_events"
    changed = []
    for path in events.glob("*.json") if events.is_dir() else []:
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if event.get("event") in _CHANGED_EVENTS:
            changed.append((path.stat().st_size, path, event))
    slimmed = False
    for size, path, event in sorted(changed, key=lambda c: c[0], reverse=True):
        if total <= budget:
            break
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        msg = str(res.get("msg", "")) if isinstance(res, Mapping) else ""
        slim: dict[str, Any] = {k: event[k] for k in _SLIM_ENVELOPE if k in event}
        slim["event_data"] = {k: data[k] for k in _SLIM_DATA if k in data}
        slim["event_data"]["res"] = {
            "changed": True,
            "msg": msg[:SLIM_MESSAGE],
            "gpuforge_slimmed": True,
        }
        text = json.dumps(slim, separators=(",", ":"))
        path.write_text(text)
        total -= size - len(text.encode())
        slimmed = True
    return slimmed
