"""The one atomic write: whole old or whole new content, the requested mode, no leftovers."""

from __future__ import annotations

import ast
import os
import stat
import sys
from pathlib import Path

import pytest

from gpuforge import atomic
from gpuforge.atomic import atomic_open, write_atomic
from gpuforge.node import bundle


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_it_replaces_the_file_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "f.json"  # parents are made
    assert write_atomic(target, "one\n") == target
    assert target.read_text() == "one\n"
    assert _mode(target) == 0o644
    write_atomic(target, b"\x00two", mode=0o600)
    assert target.read_bytes() == b"\x00two"
    assert _mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def test_mode_none_is_what_open_would_give(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "f", "x", mode=None)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target) as fh:
        fh.write("half of the new")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_fsync_writes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    write_atomic(tmp_path / "f", "x", fsync=True)
    assert len(synced) == 2  # the file, then its directory
    assert (tmp_path / "f").read_text() == "x"


def test_it_is_stdlib_only_and_in_the_node_zipapp() -> None:
    assert Path("atomic.py") in bundle.files()
    tree = ast.parse(Path(atomic.__file__).read_text())
    imported = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
