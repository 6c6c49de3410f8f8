"""The expanded cluster's helpers: host lists as python-hostlist writes them."""

from __future__ import annotations

import random

import hostlist
import pytest

from gpuforge.topology.cluster import compress


@pytest.mark.parametrize(
    "hosts",
    [
        ["gpu01"],
        ["gpu01", "gpu02", "gpu03"],
        ["gpu01", "gpu03"],
        ["gpu02", "gpu01"],
        ["gpu01", "gpu01"],
        ["gpu9", "gpu10"],
        ["gpu099", "gpu100"],
        ["gpu0", "gpu1"],
        ["a1b01", "a1b02"],
        ["n-1", "n-2"],
        ["01", "02"],
        ["x"],
        ["x", "y"],
        ["gpu01", "cpu02"],
        ["r01n01", "r01n02", "r02n01"],
    ],
)
def test_compress_writes_what_python_hostlist_writes(hosts: list[str]) -> None:
    assert compress(hosts) == hostlist.collect_hostlist(hosts)


def test_compress_agrees_with_python_hostlist_on_random_runs() -> None:
    rng = random.Random(31)
    for _ in range(2000):
        prefix = rng.choice(["gpu", "node-", "c", "", "r1n", "svc"])
        width = rng.choice([1, 2, 3, 5])
        start = rng.randrange(0, 10**width)
        count = rng.randrange(1, 40)
        numbers = list(range(start, start + count))
        if rng.random() < 0.3:
            numbers = sorted(rng.sample(numbers, max(1, count // 2)))
        if rng.random() < 0.1:
            rng.shuffle(numbers)
        hosts = [f"{prefix}{n:0{width}d}" for n in numbers]
        assert compress(hosts) == hostlist.collect_hostlist(hosts), hosts
    assert compress([]) == ""
