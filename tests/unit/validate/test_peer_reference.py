"""A batch too small for a peer comparison borrows admitted nodes' last values as peers."""

from __future__ import annotations

from pathlib import Path

from conftest import FakeRunner
from test_cli_validate import wiring

from gpuforge.validate import pipeline
from gpuforge.validate.result import Level, Status


def _peer(summary: pipeline.BatchSummary, node: str) -> pipeline.CheckResult:
    (r,) = [
        r
        for r in summary.results
        if r.node == node and r.check == "burnin.gpu_burn.min_gflops.peer"
    ]
    return r


def test_four_nodes_say_no_peer_comparison_then_borrow_admitted_peers(
    tmp_path: Path, fake: FakeRunner
) -> None:
    w, _ = wiring(tmp_path, fake=fake)
    batch = ["gpu01", "gpu02", "gpu04", "gpu05"]
    opts = pipeline.ValidationOptions(
        level=Level.BURNIN, gpu_burn_seconds=5, work_dir=tmp_path / "out"
    )
    alone = pipeline.run_validation(w.view, batch, opts, w.deps)
    r = _peer(alone, "gpu01")
    assert r.status is Status.SKIP
    assert r.message.startswith("no peer comparison (4 nodes, 5 needed); judged against the SKU")
    measured = float(r.measured or 0)

    opts.peer_reference = {
        "burnin.gpu_burn.min_gflops": {"gpu06": measured, "gpu07": measured * 1.01}
    }
    borrowed = pipeline.run_validation(w.view, batch, opts, w.deps)
    r = _peer(borrowed, "gpu01")
    assert r.status is Status.PASS
    assert "2 admitted nodes among them" in str(r.expected)
    assert {n.node for n in borrowed.nodes} == set(batch)  # the admitted nodes get no verdict
