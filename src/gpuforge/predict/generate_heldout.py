"""A second, independent fleet generator: the held-out fleets of docs/predictive.md.

``gpuforge.predict.generate`` is the fleet the scorer was first built against. This module was
written apart from it and before the scorer was retuned, from what failing hardware looks like in
telemetry, not from the scorer's thresholds; the scorer is tuned on one generator and reported on
the other (``make bench`` prints both). It shares only the telemetry format, the metric names and
the ground-truth record (``generate.Truth``).

The default fleet is the one of issue 30's tester: 128 nodes x 14 days, one sample every 6 hours
(a scrape with its own jitter per node), two node types (H200 and A100, whose clocks, temperatures
and ECC background differ: peers are per type), 8 GPUs and 4 IB ports per node, racks of 8 nodes,
leaves of 32. Nine nodes fail in the week after the window, each from a fault that has started:

* ``ecc``: an HBM row going bad: correctable ECC errors whose daily rate multiplies (x1.6-x3 a
  day), remapped rows added as the errors concentrate, a pending remap near the end;
* ``pcie``: a PCIe link degrading (riser, retimer): replays whose rate grows quadratically;
* ``ib``: a failing cable or optic: symbol errors growing faster every day, so the daily
  increment itself rises (x1.5-x2.5 a day), with an occasional link flap late;
* ``clock``: a GPU that cannot hold its clock under load (failing VRM, power brake): its SM clock
  while busy falls further behind its node's other GPUs (same job, same load) each day;
* ``thermal``: a GPU losing its thermal interface: hotter than its node's GPUs at the same load,
  increasingly so.

Load is modelled: each node alternates jobs and idle gaps; a busy GPU runs near its type's max
clock and ~25 C warmer than idle, an idle one drops to its idle clock. Every GPU of a node shares
the node's load. ``DCGM_FI_DEV_GPU_UTIL`` is exported too.

Decoys (nodes that do not fail): a large, flat IB symbol-error count (a cable replaced before the
window: its old errors stay on the HCA's counter), healthy GPUs at the top of the normal,
log-normal spread of correctable ECC (steady, not rising), a steady elevated PCIe replay rate
(marginal but stable riser), one rack whose nodes warm together (a facility finding: its CRAC,
not its nodes), a single counter reset (driver reload: ECC volatile and IB counters go to zero),
a one-off burst (hundreds to thousands of errors in one sample, anywhere in the last days), a
node that idles much more than the others (low mean clocks and temperatures, nothing wrong), and
GPU position 7 running warmer on every node (airflow order in the chassis).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpuforge.predict.generate import Truth
from gpuforge.predict.score import (
    ECC_SBE,
    IB_LINK_DOWNED,
    IB_SYMBOL,
    PCIE_REPLAY,
    REMAP_CORRECTABLE,
    REMAP_PENDING,
)
from gpuforge.predict.signals import DAY_S, GPU_TEMP, GPU_UTIL, HOUR_S, SM_CLOCK, FloatArray
from gpuforge.predict.telemetry import Event, SeriesKey, Telemetry, write_telemetry

#: 2026-10-05T00:00:00Z.
DEFAULT_START = 1_791_158_400.0
#: The failure modes of the held-out fleets.
MODES = ("ecc", "pcie", "ib", "clock", "thermal")
#: The decoy kinds (``Truth.kind`` of nodes that do not fail).
DECOYS = ("old_ib_count", "ecc_high_normal", "pcie_steady", "reset", "burst", "idle_node")

SeriesBlock = tuple[str, list[str], FloatArray, FloatArray]


@dataclass(frozen=True)
class NodeModel:
    """A node model: its clocks, temperatures and ECC background."""

    name: str
    max_clock: float
    idle_clock: float
    idle_temp: float
    ecc_median_h: float


TYPES = (
    NodeModel("h200-sxm-8x", 1980.0, 345.0, 33.0, 0.03),
    NodeModel("a100-sxm4-8x", 1410.0, 210.0, 30.0, 0.08),
)


@dataclass(frozen=True)
class HeldoutSpec:
    """Size and shape of a held-out fleet."""

    nodes: int = 128
    days: float = 14.0
    step_s: float = 6 * HOUR_S
    gpus: int = 8
    ports: int = 4
    nodes_per_rack: int = 8
    nodes_per_leaf: int = 32
    failing: int = 9
    decoys_each: int = 2  # nodes per decoy kind
    seed: int = 0
    start: float = DEFAULT_START

    @property
    def at(self) -> float:
        """The end of the telemetry: the moment the fleet is scored."""
        return self.start + self.days * DAY_S


class HeldoutFleet:
    """A held-out fleet: labels, ground truth and each node's series on demand."""

    def __init__(self, spec: HeldoutSpec) -> None:
        self.spec = spec
        rng = np.random.default_rng([spec.seed, 30_030])
        n = spec.nodes
        self.names = [f"node-{i:03d}" for i in range(n)]
        types = [TYPES[0] if i < (3 * n) // 4 else TYPES[1] for i in range(n)]
        self.types = dict(zip(self.names, types, strict=True))
        self.labels = {
            name: {
                "rack": f"rack{i // spec.nodes_per_rack:02d}",
                "leaf": f"su{i // spec.nodes_per_leaf}",
                "node_type": types[i].name,
            }
            for i, name in enumerate(self.names)
        }
        racks = sorted({v["rack"] for v in self.labels.values()})
        self.cooling_rack = str(rng.choice(racks))
        order = [int(i) for i in rng.permutation(n)]
        # pick decoys and failures outside the warming rack so each finding has one cause
        pool = [i for i in order if self.labels[self.names[i]]["rack"] != self.cooling_rack]
        modes = ["ecc", "ecc", "ib", "ib", "pcie", "clock", "clock"]
        modes += [str(m) for m in rng.choice(MODES, size=max(spec.failing - len(modes), 0))]
        modes = modes[: spec.failing]
        self.truth: dict[str, Truth] = {}
        cut = 0
        at = spec.at
        for mode in modes:
            name = self.names[pool[cut]]
            cut += 1
            units = spec.ports if mode == "ib" else spec.gpus
            unit = int(rng.integers(units))
            fail = at + float(rng.uniform(0.3, 7.0)) * DAY_S
            onset = at - float(rng.uniform(3.0, 8.0)) * DAY_S
            subject = f"mlx5_{unit}/1" if mode == "ib" else f"gpu{unit}"
            self.truth[name] = self._truth(name, "failing", mode, subject, fail=fail, onset=onset)
        for kind in DECOYS:
            for _ in range(spec.decoys_each):
                name = self.names[pool[cut]]
                cut += 1
                port = kind == "old_ib_count" or (kind in ("reset", "burst") and rng.random() < 0.5)
                unit = int(rng.integers(spec.ports if port else spec.gpus))
                subject = f"mlx5_{unit}/1" if port else f"gpu{unit}"
                self.truth[name] = self._truth(name, kind, "", subject)
        for name in self.names:
            if name not in self.truth:
                self.truth[name] = self._truth(name, "healthy", "", "")
        # the warming rack: 0.6-1.5 C a day over its last 3-5 days
        self.cooling = (float(rng.uniform(3, 5)), float(rng.uniform(0.6, 1.5)))

    def _truth(
        self,
        name: str,
        kind: str,
        mode: str,
        subject: str,
        *,
        fail: float | None = None,
        onset: float | None = None,
    ) -> Truth:
        rack, leaf = self.labels[name]["rack"], self.labels[name]["leaf"]
        facility = "cooling" if rack == self.cooling_rack else ""
        return Truth(name, kind, mode, subject, fail, onset, rack, leaf, facility)

    @property
    def at(self) -> float:
        """The end of the telemetry."""
        return self.spec.at

    def fails_within(self, horizon_s: float) -> set[str]:
        """Nodes that fail in ``(at, at + horizon_s]``."""
        return {
            t.node
            for t in self.truth.values()
            if t.fail_time is not None and self.at < t.fail_time <= self.at + horizon_s
        }

    def decoys(self) -> set[str]:
        """Nodes planted to look like a fault (and the warming rack's nodes)."""
        return {t.node for t in self.truth.values() if t.kind in DECOYS or t.facility}

    def node(self, name: str) -> tuple[list[SeriesBlock], list[Event]]:
        """Every series of ``name`` as ``(metric, subjects, t, values)``, and its events."""
        index = self.names.index(name)
        rng = np.random.default_rng([self.spec.seed, 7_919, index])
        return _Node(self, self.truth[name], self.types[name], rng).draw()

    def telemetry(self, nodes: list[str] | None = None) -> Telemetry:
        """A :class:`Telemetry` of ``nodes`` (default: all)."""
        out = Telemetry(source=f"held-out generator seed {self.spec.seed}")
        for name in nodes or self.names:
            out.labels[name] = dict(self.labels[name])
            blocks, events = self.node(name)
            for metric, subjects, t, x in blocks:
                for row, subject in enumerate(subjects):
                    if subject.startswith("gpu"):
                        key = SeriesKey(name, metric, gpu=int(subject[3:]))
                    else:
                        key = SeriesKey(name, metric, port=subject)
                    out.series[key] = (t, x[row].copy())
            out.events.extend(events)
        out.events.sort(key=lambda e: e.time)
        return out


class _Node:
    """One node's draw."""

    def __init__(
        self, fleet: HeldoutFleet, truth: Truth, kind: NodeModel, rng: np.random.Generator
    ) -> None:
        spec = fleet.spec
        self.fleet, self.spec, self.truth, self.kind, self.rng = fleet, spec, truth, kind, rng
        count = int(spec.days * DAY_S // spec.step_s)
        jitter = rng.uniform(-600, 600)  # this node's scrape offset
        self.t = spec.start + jitter + spec.step_s * np.arange(1, count + 1, dtype=np.float64)
        self.t = self.t[self.t <= spec.at]
        self.n = len(self.t)
        self.days_left = (spec.at - self.t) / DAY_S  # days before the end, per sample
        if truth.onset is not None:
            self.age = np.clip((self.t - truth.onset) / DAY_S, 0.0, None)  # days into the fault
        else:
            self.age = np.zeros(self.n)
        self.unit = (
            int(truth.subject.split("/")[0][5:])
            if truth.subject.startswith("mlx5_")
            else (int(truth.subject[3:]) if truth.subject.startswith("gpu") else 0)
        )
        self.gpus = [f"gpu{g}" for g in range(spec.gpus)]
        self.ports = [f"mlx5_{p}/1" for p in range(spec.ports)]
        self.load = self._load()

    def _is(self, kind: str, mode: str = "") -> bool:
        return self.truth.kind == kind and (not mode or self.truth.mode == mode)

    def _load(self) -> FloatArray:
        """1 while a job runs, 0 idle: jobs of 4-72 h, gaps of 1-24 h (an idle node: long gaps)."""
        busy_share = 0.25 if self._is("idle_node") else float(self.rng.uniform(0.6, 0.95))
        load = np.zeros(self.n)
        clock = self.spec.start - float(self.rng.uniform(0, 2 * DAY_S))
        busy = bool(self.rng.random() < busy_share)
        while clock < self.spec.at:
            hours = float(self.rng.uniform(4, 72)) if busy else float(self.rng.uniform(1, 24))
            if not busy:
                hours *= (1 - busy_share) / max(busy_share, 0.05) * 2
            end = clock + hours * HOUR_S
            if busy:
                load[(self.t >= clock) & (self.t < end)] = 1.0
            clock, busy = end, not busy
        return load

    def _poisson_counter(self, rate_h: FloatArray) -> FloatArray:
        """A counter from per-sample rates (per hour), shape (rows, n)."""
        lam = np.clip(rate_h, 0, None) * (self.spec.step_s / HOUR_S)
        return np.cumsum(self.rng.poisson(lam), axis=1).astype(np.float64)

    def draw(self) -> tuple[list[SeriesBlock], list[Event]]:
        """The node's series (and events: none; failures come after the window)."""
        spec = self.spec
        ecc, pcie, ib, downed = self._counters()
        remap, pending = self._remaps(ecc)
        self._decoy_counters(ecc, ib)
        clock, temp = self._gauges()
        util = np.repeat((self.load * 97.0)[None, :], spec.gpus, 0)
        blocks: list[SeriesBlock] = [
            (ECC_SBE, self.gpus, self.t, ecc),
            (PCIE_REPLAY, self.gpus, self.t, pcie),
            (REMAP_CORRECTABLE, self.gpus, self.t, remap),
            (REMAP_PENDING, self.gpus, self.t, pending),
            (IB_SYMBOL, self.ports, self.t, ib),
            (IB_LINK_DOWNED, self.ports, self.t, downed),
            (GPU_TEMP, self.gpus, self.t, temp),
            (SM_CLOCK, self.gpus, self.t, clock),
            (GPU_UTIL, self.gpus, self.t, util),
        ]
        return blocks, []

    def _counters(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Correctable ECC, PCIe replays, IB symbol errors and link-downed counters."""
        spec, rng, n, u = self.spec, self.rng, self.n, self.unit
        ones = np.ones(n)
        busy = 0.4 + 0.6 * self.load  # more errors at load
        # correctable ECC: log-normal across GPUs (sigma 1.3: a wide healthy spread)
        ecc_rate = (self.kind.ecc_median_h * np.exp(rng.normal(0, 1.3, spec.gpus)))[:, None]
        ecc_rate = ecc_rate * busy[None, :]
        pcie_rate = np.repeat(rng.gamma(2.0, 0.02, spec.gpus)[:, None], n, axis=1)
        ib_rate = np.repeat(rng.gamma(1.5, 0.03, spec.ports)[:, None], n, axis=1)
        if self._is("ecc_high_normal"):
            # the top of the healthy spread: a steady 1-6 errors an hour, for months
            ecc_rate[u] = float(rng.uniform(1.0, 6.0)) * busy
        if self._is("pcie_steady"):
            pcie_rate[u] = float(rng.uniform(1.0, 5.0)) * ones
        if self._is("failing", "ecc"):
            per_day = float(rng.uniform(1.6, 3.0))
            start = float(rng.uniform(0.05, 0.3))
            rate = np.where(self.age > 0, start * per_day**self.age, 0.0)
            ecc_rate[u] += rate * (0.5 + 0.5 * self.load)
        if self._is("failing", "pcie"):
            pcie_rate[u] += np.where(self.age > 0, float(rng.uniform(0.3, 1.5)) * self.age**2, 0)
        if self._is("failing", "ib"):
            per_day = float(rng.uniform(1.5, 2.5))
            start = float(rng.uniform(0.1, 0.5))
            ib_rate[u] += np.where(self.age > 0, start * per_day**self.age, 0.0)
        downed = np.zeros((spec.ports, n))
        if self._is("failing", "ib"):
            for i in np.nonzero((self.age > 2) & (rng.random(n) < 0.08))[0]:
                downed[u, i:] += 1
        return (
            self._poisson_counter(ecc_rate),
            self._poisson_counter(pcie_rate),
            self._poisson_counter(ib_rate),
            downed,
        )

    def _remaps(self, ecc: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Remapped rows (a few from the factory; a failing HBM row adds them) and pending."""
        spec, rng, n, u = self.spec, self.rng, self.n, self.unit
        remap = np.zeros((spec.gpus, n))
        pending = np.zeros((spec.gpus, n))
        factory = rng.random(spec.gpus) < 0.15
        remap[factory] = rng.integers(1, 4, int(factory.sum()))[:, None]
        if self._is("failing", "ecc"):
            # rows remapped as errors concentrate on a few rows: one per ~40-120 errors
            per_row = float(rng.uniform(40, 120))
            since = ecc[u] - ecc[u][int(np.argmax(self.age > 0))]
            remap[u] += np.minimum(np.floor(np.clip(since, 0, None) / per_row), 60)
            pending[u] = (self.age > 0) & (self.days_left < 1.0)
        return remap, pending

    def _decoy_counters(self, ecc: FloatArray, ib: FloatArray) -> None:
        """Old counts, resets and bursts, in place."""
        rng, n, u, at = self.rng, self.n, self.unit, self.spec.at
        rows = ib if self.truth.subject.startswith("mlx5_") else ecc
        if self._is("old_ib_count"):
            # a cable that failed months ago, replaced: its errors stay on the counter
            ib[u] += float(rng.uniform(2e4, 5e5))
            if rng.random() < 0.5:  # replaced during the window: growth, then flat
                cut = int(rng.integers(n // 5, n // 3))
                burst = np.cumsum(rng.poisson(float(rng.uniform(50, 400)), cut))
                ib[u, :cut] += burst - burst[-1]
        if self._is("reset"):
            # a driver reload or perfquery -R: the counter goes to zero once and goes on
            i = int(rng.integers(n // 2, n - 2))
            rows[u] += float(rng.uniform(1e3, 1e5))
            rows[u, i:] = np.clip(rows[u, i:] - rows[u, i - 1], 0, None)
        if self._is("burst"):
            # one sample carries hundreds to thousands of errors, anywhere in the last four
            # days, then back to the background
            i = int(np.searchsorted(self.t, at - float(rng.uniform(0.3, 4.0)) * DAY_S))
            rows[u, min(i, n - 1) :] += float(rng.uniform(300, 5000))

    def _gauges(self) -> tuple[FloatArray, FloatArray]:
        spec, rng, n, kind, g = self.spec, self.rng, self.n, self.kind, self.unit
        load = self.load[None, :]
        # clocks: busy near max with power/thermal management noise, idle at the idle clock
        busy_clock = kind.max_clock - np.abs(rng.normal(0, 25, (spec.gpus, n)))
        busy_clock -= rng.uniform(0, 30, spec.gpus)[:, None]  # silicon lottery
        idle_clock = kind.idle_clock + rng.normal(0, 10, (spec.gpus, n))
        clock = np.where(load > 0, busy_clock, idle_clock)
        if self._is("failing", "clock"):
            sag = float(rng.uniform(25, 60)) * self.age  # MHz further behind each day
            clock[g] -= np.where(self.load > 0, np.minimum(sag, kind.max_clock * 0.4), 0.0)
        # temperatures: inlet (rack) + position + load + noise; GPU 7 sits last in the airflow
        rack = int(self.truth.rack[4:])
        rack_rng = np.random.default_rng([spec.seed, 4_242, rack])
        inlet = 24.0 + float(rack_rng.normal(0, 1.5))
        hour = (self.t / HOUR_S) % 24
        inlet_t = inlet + 1.0 * np.sin(2 * np.pi * (hour - 15) / 24)
        position = rng.normal(0, 1.5, spec.gpus)
        position[spec.gpus - 1] += 3.0
        temp = (
            kind.idle_temp
            - 24.0
            + inlet_t[None, :]
            + position[:, None]
            + load * float(rng.uniform(22, 30))
            + rng.normal(0, 1.2, (spec.gpus, n))
        )
        if self.truth.facility == "cooling":
            days, per_day = self.fleet.cooling
            temp += np.clip(days - self.days_left, 0, None)[None, :] * per_day
        if self._is("failing", "thermal"):
            temp[g] += np.where(self.load > 0, float(rng.uniform(1.5, 3.5)) * self.age, 0.0)
        return np.round(clock).astype(np.float64), np.round(temp).astype(np.float64)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuforge.predict.generate_heldout``: a telemetry file and its truth file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="telemetry (JSON Lines)")
    parser.add_argument("--truth", type=Path, required=True, help="failure times (JSON)")
    args = parser.parse_args(argv)
    fleet = HeldoutFleet(HeldoutSpec(nodes=args.nodes, days=args.days, seed=args.seed))
    with args.out.open("w", encoding="utf-8") as out:
        lines = write_telemetry(fleet.telemetry(), out)
    args.truth.write_text(
        json.dumps(
            {
                "at": fleet.at,
                "spec": asdict(fleet.spec),
                "cooling_rack": fleet.cooling_rack,
                "nodes": [asdict(t) for t in fleet.truth.values()],
            },
            indent=1,
        )
    )
    sys.stderr.write(f"{args.out}: {lines} lines; {args.truth}: ground truth\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
