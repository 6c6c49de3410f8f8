"""Admitted nodes as known-good partners: a lone suspect still gets its ib_write_bw test."""

from __future__ import annotations

from pathlib import Path

from conftest import FakeRunner
from test_cli_validate import wiring

from gpuforge.validate import pipeline
from gpuforge.validate.result import Level, Status


def test_a_single_node_is_paired_with_a_known_good_partner(
    tmp_path: Path, fake: FakeRunner
) -> None:
    w, _ = wiring(tmp_path, fake=fake)
    opts = pipeline.ValidationOptions(
        level=Level.BURNIN, gpu_burn_seconds=5, work_dir=tmp_path / "out"
    )
    alone = pipeline.run_validation(w.view, ["gpu01"], opts, w.deps)
    (result,) = [r for r in alone.results if r.check == "burnin.ib_write_bw"]
    assert result.status is Status.ERROR  # nobody to pair with: inconclusive, held

    fake.calls.clear()
    paired = pipeline.run_validation(w.view, ["gpu01"], opts, w.deps, known_good=["gpu05"])
    bw = [r for r in paired.results if r.check.startswith("burnin.ib_write_bw[")]
    assert bw
    assert {r.node for r in bw} == {"gpu01"}  # the partner gets no verdict of its own
    assert all(r.status is Status.PASS for r in bw)
    assert {h for h, c, _ in fake.calls if "ib_write_bw" in c} == {"gpu01", "gpu05"}
    assert [n.node for n in paired.nodes] == ["gpu01"]
