"""Culprit localization against a synthetic fabric: slow nodes and slow uplinks."""

from __future__ import annotations

import math

import pytest

from gpuforge.validate.nccl import (
    FabricNode,
    Localizer,
    acceptance_plan,
    localization_results,
    run_bound,
)
from gpuforge.validate.result import Status

GOOD = 380.0
FLOOR = 320.0


def fabric(n: int, per_leaf: int) -> dict[str, str]:
    return {f"gpu{i:03d}": f"leaf{i // per_leaf:02d}" for i in range(n)}


class Model:
    """busbw of a group = the slowest member; a slow uplink halves every cross-leaf group."""

    def __init__(self, leaves: dict[str, str], slow=(), slow_uplinks=()):
        self.leaves = leaves
        self.slow = set(slow)
        self.slow_uplinks = set(slow_uplinks)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, nodes: tuple[str, ...]) -> float:
        self.calls.append(nodes)
        bw = GOOD
        if self.slow & set(nodes):
            bw = 150.0
        used = {self.leaves[n] for n in nodes}
        if len(used) > 1 and used & self.slow_uplinks:
            bw = min(bw, 190.0)
        return bw


@pytest.mark.parametrize("n", [8, 32, 128])
def test_finds_one_slow_node(n: int) -> None:
    leaves = fabric(n, per_leaf=min(n, 16))
    culprit = f"gpu{n // 3:03d}"
    model = Model(leaves, slow={culprit})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert loc.culprits == (culprit,)
    assert loc.findings == ()
    assert loc.unresolved == ()
    assert set(loc.cleared) == set(leaves) - {culprit}
    assert loc.run_count == len(model.calls)
    assert loc.run_count <= run_bound(1, n)
    assert loc.run_count < n  # better than pairing every node


@pytest.mark.parametrize("n", [8, 32, 128])
def test_finds_two_slow_nodes(n: int) -> None:
    leaves = fabric(n, per_leaf=min(n, 16))
    culprits = {"gpu001", f"gpu{n - 2:03d}"}
    model = Model(leaves, slow=culprits)
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert set(loc.culprits) == culprits
    assert loc.findings == ()
    assert loc.run_count <= run_bound(2, n)


def test_two_slow_nodes_on_the_same_leaf_adjacent() -> None:
    leaves = fabric(32, per_leaf=8)
    model = Model(leaves, slow={"gpu004", "gpu005"})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert set(loc.culprits) == {"gpu004", "gpu005"}


def test_run_count_grows_logarithmically() -> None:
    counts = {}
    for n in (16, 64, 256, 1024):
        leaves = fabric(n, per_leaf=16)
        model = Model(leaves, slow={f"gpu{n - 5:03d}" if n < 1000 else "gpu1019"})
        counts[n] = Localizer(model, FLOOR, leaves).localize(sorted(leaves)).run_count
    # doubling n twice adds a bounded number of runs, it does not multiply them
    assert counts[1024] <= counts[16] + 2 * 2 * math.log2(1024 / 16) + 2


def test_healthy_batch_costs_one_run() -> None:
    leaves = fabric(32, per_leaf=8)
    loc = Localizer(Model(leaves), FLOOR, leaves).localize(sorted(leaves))
    assert loc.run_count == 1
    assert loc.culprits == ()
    assert len(loc.cleared) == 32


def test_slow_uplink_blames_the_leaf_not_the_nodes() -> None:
    leaves = fabric(32, per_leaf=8)  # four leaves
    model = Model(leaves, slow_uplinks={"leaf02"})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert loc.culprits == ()
    assert loc.unresolved == ()
    assert [(f.kind, f.subject) for f in loc.findings] == [("leaf-uplink", "leaf02")]
    assert loc.run_count <= run_bound(1, 32)


def test_slow_uplink_with_two_leaves_names_the_path() -> None:
    leaves = fabric(16, per_leaf=8)  # no third leaf to compare with
    model = Model(leaves, slow_uplinks={"leaf01"})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert loc.culprits == ()
    assert [(f.kind, f.subject) for f in loc.findings] == [("leaf-path", "leaf00 <-> leaf01")]


def test_slow_node_and_slow_uplink_together() -> None:
    leaves = fabric(64, per_leaf=16)
    model = Model(leaves, slow={"gpu005"}, slow_uplinks={"leaf03"})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    assert loc.culprits == ("gpu005",)
    assert {f.subject for f in loc.findings} == {"leaf03"}


def test_rounds_are_parallel_and_disjoint() -> None:
    leaves = fabric(32, per_leaf=8)
    model = Model(leaves, slow={"gpu009"})
    loc = Localizer(model, FLOOR, leaves).localize(sorted(leaves))
    by_round: dict[str, list[tuple[str, ...]]] = {}
    for r in loc.runs:
        by_round.setdefault(r.label, []).append(r.nodes)
    for groups in by_round.values():
        flat = [n for g in groups for n in g]
        assert len(flat) == len(set(flat))
    assert loc.rounds <= 2 * math.ceil(math.log2(32)) + 1


def test_two_node_batch_without_reference_is_unresolved_not_blamed() -> None:
    leaves = {"a": "l1", "b": "l1"}
    loc = Localizer(Model(leaves, slow={"a"}), FLOOR, leaves).localize(["a", "b"])
    assert loc.culprits == ()
    assert set(loc.unresolved) == {"a", "b"}


def test_hung_collective_counts_as_zero() -> None:
    leaves = fabric(8, per_leaf=8)

    def run(nodes: tuple[str, ...]) -> float:
        return 0.0 if "gpu003" in nodes else GOOD

    loc = Localizer(run, FLOOR, leaves).localize(sorted(leaves))
    assert loc.culprits == ("gpu003",)


def test_acceptance_plan_covers_leaves_and_rails() -> None:
    nodes = [
        FabricNode(f"gpu{i:02d}", tuple(f"r{r}-leaf{i // 4}" for r in range(4))) for i in range(16)
    ]
    plan = acceptance_plan(nodes)
    names = [p.name for p in plan]
    assert names[:5] == ["batch", "rail0", "rail1", "rail2", "rail3"]
    cross = [p for p in plan if p.name.startswith("cross-leaf")]
    assert len(cross) == 2
    touched = {frozenset(nodes[int(n[3:])].leaf_key for n in g) for p in cross for g in p.groups}
    keys = sorted({n.leaf_key for n in nodes})
    ring = {frozenset((keys[i], keys[(i + 1) % len(keys)])) for i in range(len(keys))}
    assert touched == ring
    for p in cross:
        flat = [n for g in p.groups for n in g]
        assert len(flat) == len(set(flat))
        assert all(len(g) == 2 for g in p.groups)


def test_results_carry_the_busbw_that_judged_each_node() -> None:
    leaves = fabric(8, per_leaf=8)
    loc = Localizer(Model(leaves, slow={"gpu005"}), FLOOR, leaves).localize(sorted(leaves))
    res = {r.node: r for r in localization_results(loc, check="nccl.multinode", floor_gbs=FLOOR)}
    assert res["gpu005"].status is Status.FAIL
    assert res["gpu005"].measured == 150.0
    assert res["gpu000"].status is Status.PASS
    assert res["gpu000"].measured == GOOD
    assert "GB/s (floor 320.0)" in res["gpu000"].evidence
