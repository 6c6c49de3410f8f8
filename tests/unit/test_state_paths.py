"""One object names a cluster's state: the stores' path helpers agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.admission import record_path
from gpuforge.history.store import history_path
from gpuforge.rollout.lock import play_record
from gpuforge.state_paths import StatePaths, collector_lock_of, default_state_dir


def test_the_layout_of_one_cluster(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state", "lab", report_dir=tmp_path / "reports")
    assert paths.root == tmp_path / "state" / "lab"
    assert paths.rollout_db == paths.root / "rollout.db"
    assert paths.admission_db == paths.root / "admission.db" == record_path(paths.state_dir, "lab")
    assert paths.history_db == paths.root / "history.db" == history_path(paths.state_dir, "lab")
    assert paths.lock == paths.root / "rollout.lock"
    assert paths.play_record == paths.root / "rollout.play" == play_record(paths.lock)
    assert paths.conformance_lock == paths.root / "conformance.lock"
    assert paths.collector_lock == paths.root / "collector.lock"
    assert collector_lock_of(paths.history_db) == paths.collector_lock
    assert paths.reports == tmp_path / "reports" / "lab"
    assert not (tmp_path / "state").exists()  # naming a path creates nothing


def test_clusters_with_a_file(tmp_path: Path) -> None:
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "history.db").write_bytes(b"")
    (tmp_path / "c").mkdir()
    assert StatePaths.clusters_with(tmp_path, "history.db") == ["a", "b"]


def test_the_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFORGE_STATE_DIR", raising=False)
    assert default_state_dir() == Path("state")
    monkeypatch.setenv("GPUFORGE_STATE_DIR", "/srv/gpuforge")
    assert default_state_dir() == Path("/srv/gpuforge")
