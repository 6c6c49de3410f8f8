"""``gpuforge lab down`` also drops the lab's rollout record: its nodes are gone."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.lab import lifecycle


def test_lab_down_removes_the_labs_rollout_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "down", lambda name: [f"{name}-gpu01"])
    record = tmp_path / "lab"
    record.mkdir()
    (record / "rollout.db").write_bytes(b"SQLite format 3\0")
    other = tmp_path / "prod"  # another cluster's record is not the lab's to remove
    other.mkdir()
    (other / "rollout.db").write_bytes(b"SQLite format 3\0")

    res = CliRunner().invoke(main, ["lab", "down", "--lab", "lab", "--state-dir", str(tmp_path)])

    assert res.exit_code == 0, res.output
    assert "removed its rollout record" in res.output
    assert not record.exists()
    assert (other / "rollout.db").is_file()
