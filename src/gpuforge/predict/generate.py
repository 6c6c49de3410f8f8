"""Synthetic fleet telemetry with known failure times (docs/predictive.md, "Generator").

The model, per node (after the fleet-level draw of who degrades, spikes or sits in a facility
event, each node draws from its own generator seeded by ``(seed, index)``: a node's series are the
same whether it is generated alone, in a subset, or with the whole fleet, in any order):

* healthy noise: per-GPU correctable ECC, PCIe replay and NVLink CRC counters and per-port IB
  symbol errors grow as Poisson processes at small rates (the ECC rate is log-normal across GPUs,
  so a few healthy GPUs run a steady higher rate); GPU temperature is a per-GPU base plus a rack
  offset, a daily cycle and noise; SM clocks are flat with noise; a few GPUs carry a handful of
  remapped rows from the factory;
* degradation leading to a failure (:data:`MODES`): from an onset 2-10 days before the failure
  the fault grows (ECC rate rising exponentially with remapped rows following, PCIe replays, NVLink
  CRC errors, IB symbol errors with link flaps, one GPU's temperature drifting up, its clock
  sagging, Xid 13/31/43 recurring on one GPU); some failures come with no warning (``sudden``);
* one-off spikes leading nowhere: a burst of ECC or IB errors in one sample, one or two Xid 13;
* facility events: a rack warming together (cooling), a leaf whose ports all see symbol errors;
* steady-high: a healthy GPU with an elevated but constant ECC rate (benign, a known false alarm).

Failure times are kept apart from the telemetry (:attr:`GeneratedFleet.truth`), as the bench
needs them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpuforge.predict.score import (
    BANKS_LOW,
    BANKS_NONE,
    ECC_SBE,
    IB_LINK_DOWNED,
    IB_SYMBOL,
    NVLINK_CRC,
    PCIE_REPLAY,
    REMAP_CORRECTABLE,
    REMAP_FAILURE,
    REMAP_PENDING,
    REMAP_UNCORRECTABLE,
)
from gpuforge.predict.signals import DAY_S, GPU_TEMP, HOUR_S, SM_CLOCK, FloatArray
from gpuforge.predict.telemetry import Event, SeriesKey, Telemetry, write_telemetry

#: Degradation modes and their share among failures that give warning.
MODES = {
    "ecc": 0.30,
    "ib": 0.20,
    "pcie": 0.10,
    "nvlink": 0.10,
    "thermal": 0.10,
    "xid": 0.15,
    "clock": 0.05,
}
#: 2026-11-01T00:00:00Z: generated telemetry starts here unless told otherwise.
DEFAULT_START = 1_793_491_200.0

SeriesBlock = tuple[str, list[str], FloatArray, FloatArray]


@dataclass(frozen=True)
class FleetSpec:
    """Size and shape of a generated fleet."""

    nodes: int = 2000
    days: float = 30.0
    step_s: float = 300.0
    gpus: int = 8
    ports: int = 8
    nodes_per_rack: int = 8
    nodes_per_leaf: int = 32
    seed: int = 0
    start: float = DEFAULT_START
    fail_fraction: float = 0.03  # nodes that degrade towards a failure in the 14 days after `at`
    sudden_fraction: float = 0.005  # nodes that fail within 7 days with no warning
    spike_fraction: float = 0.05
    steady_high_fraction: float = 0.03

    @property
    def at(self) -> float:
        """The end of the telemetry: the moment the fleet is scored."""
        return self.start + self.days * DAY_S


@dataclass(frozen=True)
class Truth:
    """What a generator put into one node (never visible to the scorer): this module's tuning
    fleets and :mod:`~gpuforge.predict.generate_heldout`'s held-out ones."""

    node: str
    #: here: healthy | degrading | sudden | spike | steady_high; held out: healthy | failing |
    #: one of its DECOYS
    kind: str
    mode: str = ""
    subject: str = ""
    fail_time: float | None = None
    onset: float | None = None
    rack: str = ""
    leaf: str = ""
    facility: str = ""  # cooling | fabric when the node's rack or leaf had an event


def node_name(index: int) -> str:
    """``gpu00001``: generated node names sort in index order."""
    return f"gpu{index + 1:05d}"


class GeneratedFleet:
    """A generated fleet: labels, ground truth, and each node's series on demand."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        rng = np.random.default_rng([spec.seed, 1 << 30])
        n = spec.nodes
        self.names = [node_name(i) for i in range(n)]
        racks = [f"r{i // spec.nodes_per_rack:04d}" for i in range(n)]
        leaves = [f"leaf{i // spec.nodes_per_leaf:03d}" for i in range(n)]
        self.labels = {
            name: {"rack": racks[i], "leaf": leaves[i], "node_type": "h100-sxm-8x"}
            for i, name in enumerate(self.names)
        }
        order = rng.permutation(n)
        n_fail = round(spec.fail_fraction * n)
        n_sudden = round(spec.sudden_fraction * n)
        n_spike = round(spec.spike_fraction * n)
        n_steady = round(spec.steady_high_fraction * n)
        kinds = ["healthy"] * n
        cut = 0
        for kind, count in (
            ("degrading", n_fail),
            ("sudden", n_sudden),
            ("spike", n_spike),
            ("steady_high", n_steady),
        ):
            for i in order[cut : cut + count]:
                kinds[int(i)] = kind
            cut += count
        # facility events strike whole racks and leaves (a partial last one is left out)
        rack_names = sorted(r for r in set(racks) if racks.count(r) == spec.nodes_per_rack)
        leaf_names = sorted(x for x in set(leaves) if leaves.count(x) == spec.nodes_per_leaf)
        n_cool = max(1, n // 250) if len(rack_names) > 2 else 0
        n_fabric = max(1, n // 1000) if len(leaf_names) > 2 else 0
        self.cooling = {
            str(r): (float(rng.uniform(2, 5)), float(rng.uniform(0.8, 2.0)))
            for r in rng.choice(rack_names, size=n_cool, replace=False)
        }
        self.fabric = {
            str(x): (float(rng.uniform(1, 3)), float(rng.uniform(20, 100)))
            for x in rng.choice(leaf_names, size=n_fabric, replace=False)
        }
        modes = list(MODES)
        weights = np.asarray(list(MODES.values()))
        self.truth: dict[str, Truth] = {}
        for i, name in enumerate(self.names):
            kind = kinds[i]
            facility = (
                "cooling"
                if racks[i] in self.cooling
                else "fabric"
                if leaves[i] in self.fabric
                else ""
            )
            mode, subject, fail, onset = "", "", None, None
            if kind == "degrading":
                mode = str(rng.choice(modes, p=weights / weights.sum()))
                fail = spec.at + float(rng.uniform(0.1, 14)) * DAY_S
                onset = fail - float(rng.uniform(2, 10)) * DAY_S
                unit = int(rng.integers(spec.ports if mode == "ib" else spec.gpus))
                subject = f"mlx5_{unit}/1" if mode == "ib" else f"gpu{unit}"
            elif kind == "sudden":
                fail = spec.at + float(rng.uniform(0.1, 7)) * DAY_S
            elif kind in ("spike", "steady_high"):
                mode = str(rng.choice(["ecc", "ib", "xid"])) if kind == "spike" else "ecc"
                unit = int(rng.integers(spec.ports if mode == "ib" else spec.gpus))
                subject = f"mlx5_{unit}/1" if mode == "ib" else f"gpu{unit}"
            self.truth[name] = Truth(
                name, kind, mode, subject, fail, onset, racks[i], leaves[i], facility
            )

    def fails_within(self, horizon_s: float) -> set[str]:
        """Nodes that fail in ``(at, at + horizon_s]``."""
        at = self.spec.at
        return {
            t.node
            for t in self.truth.values()
            if t.fail_time is not None and at < t.fail_time <= at + horizon_s
        }

    def times(self) -> FloatArray:
        """The sample times shared by every series."""
        spec = self.spec
        count = int(spec.days * DAY_S // spec.step_s)
        return spec.start + spec.step_s * np.arange(1, count + 1, dtype=np.float64)

    # -- one node

    def node(self, name: str) -> tuple[list[SeriesBlock], list[Event]]:
        """Every series of ``name`` as ``(metric, subjects, t, values)``, and its events."""
        index = self.names.index(name) if len(self.names) < 64 else int(name[3:]) - 1
        draw = _NodeDraw(self, self.truth[name], np.random.default_rng([self.spec.seed, index]))
        blocks = draw.counters() + draw.remaps() + draw.gauges()
        return blocks, self._events(draw.rng, draw.truth, draw.t, draw.ramp)

    def _events(
        self, rng: np.random.Generator, truth: Truth, t: FloatArray, ramp: FloatArray
    ) -> list[Event]:
        events: list[Event] = []
        g = int(truth.subject[3:]) if truth.subject.startswith("gpu") else None
        if truth.kind == "degrading" and truth.mode == "xid":
            # a Poisson process from 0.2 to 4 per day as the fault grows
            rate_per_step = (0.2 + 3.8 * ramp) * (ramp > 0) * self.spec.step_s / DAY_S
            hits = np.nonzero(rng.random(len(t)) < rate_per_step)[0]
            for i in hits:
                code = int(rng.choice([13, 31, 43]))
                events.append(Event(float(t[i]), truth.node, "xid", g, code, "generated"))
        if truth.kind == "spike" and truth.mode == "xid":
            for i in rng.integers(0, len(t), int(rng.integers(1, 3))):
                events.append(Event(float(t[i]), truth.node, "xid", g, 13, "generated"))
        return sorted(events, key=lambda e: e.time)

    def telemetry(self, nodes: list[str] | None = None) -> Telemetry:
        """A :class:`Telemetry` of ``nodes`` (default: all): for files and small tests."""
        out = Telemetry(source=f"generated seed {self.spec.seed}")
        for name in nodes or self.names:
            out.labels[name] = dict(self.labels[name])
            blocks, events = self.node(name)
            for metric, subjects, t, x in blocks:
                for row, subject in enumerate(subjects):
                    key = _key(name, metric, subject)
                    out.series[key] = (t, x[row].copy())
            out.events.extend(events)
        out.events.sort(key=lambda e: e.time)
        return out

    def iter_nodes(self) -> Iterator[tuple[str, list[SeriesBlock], list[Event]]]:
        """Every node's series and events, one node at a time (bounded memory)."""
        for name in self.names:
            blocks, events = self.node(name)
            yield name, blocks, events


class _NodeDraw:
    """One node's random draw: the model of the module docstring, metric by metric."""

    def __init__(self, fleet: GeneratedFleet, truth: Truth, rng: np.random.Generator) -> None:
        self.fleet = fleet
        self.spec = fleet.spec
        self.truth = truth
        self.rng = rng
        self.t = fleet.times()
        self.count = len(self.t)
        self.ramp = _ramp(self.t, truth)  # 0 before onset, rising to 1 at the failure
        self.gpus = [f"gpu{g}" for g in range(self.spec.gpus)]
        self.ports = [f"mlx5_{p}/1" for p in range(self.spec.ports)]
        subject = truth.subject
        self.g = int(subject[3:]) if subject.startswith("gpu") else 0
        self.p = int(subject[5:].split("/")[0]) if subject.startswith("mlx5_") else 0

    def _is(self, kind: str, mode: str) -> bool:
        return self.truth.kind == kind and self.truth.mode == mode

    def _counter(self, rates: FloatArray) -> FloatArray:
        lam = np.clip(rates, 0, None) * (self.spec.step_s / HOUR_S)
        return np.cumsum(self.rng.poisson(lam), axis=1).astype(np.float64)

    def _baseline(self, rows: int, mean_h: float, sigma: float = 0.0) -> FloatArray:
        spread = np.exp(self.rng.normal(0, sigma, rows)) if sigma else np.ones(rows)
        return np.repeat((mean_h * spread)[:, None], self.count, axis=1)

    def counters(self) -> list[SeriesBlock]:
        """ECC, PCIe, NVLink, IB symbol errors and link-downed counters."""
        spec, truth, t, g, p = self.spec, self.truth, self.t, self.g, self.p
        rates = {
            "ecc": self._baseline(spec.gpus, 0.01, 1.0),
            "pcie": self._baseline(spec.gpus, 0.05),
            "nvlink": self._baseline(spec.gpus, 0.02),
            "ib": self._baseline(spec.ports, 0.05),
        }
        if truth.kind == "steady_high":
            rates["ecc"][g] = float(self.rng.uniform(2, 6))
        if truth.kind == "degrading" and truth.mode in rates:
            grow = np.expm1(self.ramp * math.log(1 + float(self.rng.uniform(200, 1000))))
            rates[truth.mode][p if truth.mode == "ib" else g] += grow
        if truth.facility == "fabric":
            days, rate = self.fleet.fabric[truth.leaf]
            rates["ib"][0] += np.where(t >= spec.at - days * DAY_S, rate, 0.0)
        values = {mode: self._counter(r) for mode, r in rates.items()}
        if truth.kind == "spike" and truth.mode in ("ecc", "ib"):
            at_i = int(self.rng.integers(self.count // 2, self.count))
            row = g if truth.mode == "ecc" else p
            values[truth.mode][row, at_i:] += float(self.rng.integers(50, 500))
        downed = np.zeros((spec.ports, self.count))
        if self._is("degrading", "ib"):
            for at_i in np.sort(
                self.rng.integers(0, self.count, self.rng.poisson(4 * self.ramp[-1]))
            ):
                if self.ramp[at_i] > 0.5:
                    downed[p, at_i:] += 1
        return [
            (ECC_SBE, self.gpus, t, values["ecc"]),
            (PCIE_REPLAY, self.gpus, t, values["pcie"]),
            (NVLINK_CRC, self.gpus, t, values["nvlink"]),
            (IB_SYMBOL, self.ports, t, values["ib"]),
            (IB_LINK_DOWNED, self.ports, t, downed),
        ]

    def remaps(self) -> list[SeriesBlock]:
        """Remapped rows: a few from the factory; an ECC degradation adds rows as it grows."""
        gpus, count = self.spec.gpus, self.count
        corr = np.zeros((gpus, count))
        factory = self.rng.random(gpus) < 0.1
        corr[factory] = self.rng.integers(1, 5, int(factory.sum()))[:, None]
        banks_low = np.zeros((gpus, count))
        if self._is("degrading", "ecc"):
            rows = np.floor(self.ramp * float(self.rng.uniform(4, 24)))
            corr[self.g] += rows
            banks_low[self.g] = (rows >= 8).astype(np.float64)
        zeros = np.zeros((gpus, count))
        return [
            (REMAP_CORRECTABLE, self.gpus, self.t, corr),
            (REMAP_UNCORRECTABLE, self.gpus, self.t, zeros),
            (REMAP_PENDING, self.gpus, self.t, zeros),
            (REMAP_FAILURE, self.gpus, self.t, zeros),
            (BANKS_LOW, self.gpus, self.t, banks_low),
            (BANKS_NONE, self.gpus, self.t, zeros),
        ]

    def gauges(self) -> list[SeriesBlock]:
        """Temperature (base, rack offset, daily cycle, noise, drifts, facility) and SM clock."""
        spec, truth, t, g = self.spec, self.truth, self.t, self.g
        rack_rng = np.random.default_rng([spec.seed, 1 << 29, int(truth.rack[1:])])
        rack_offset, phase = float(rack_rng.normal(0, 1.5)), float(rack_rng.uniform(0, 6.3))
        base = 45 + rack_offset + self.rng.normal(0, 3, spec.gpus)
        cycle = 1.5 * np.sin(2 * np.pi * (t - spec.start) / DAY_S + phase)
        temp = base[:, None] + cycle[None, :] + self.rng.normal(0, 0.5, (spec.gpus, self.count))
        if truth.facility == "cooling":
            days, per_day = self.fleet.cooling[truth.rack]
            temp += np.clip((t - (spec.at - days * DAY_S)) / DAY_S, 0, None) * per_day
        if self._is("degrading", "thermal"):
            temp[g] += self.ramp * float(self.rng.uniform(8, 20))
        noise = self.rng.normal(0, 8, (spec.gpus, self.count))
        clock = 1980 + self.rng.normal(0, 5, spec.gpus)[:, None] + noise
        if self._is("degrading", "clock"):
            clock[g] -= self.ramp * float(self.rng.uniform(150, 400))
        return [
            (GPU_TEMP, self.gpus, t, np.round(temp, 0)),
            (SM_CLOCK, self.gpus, t, np.round(clock, 0)),
        ]


def _key(node: str, metric: str, subject: str) -> SeriesKey:
    if subject.startswith("gpu"):
        return SeriesKey(node, metric, gpu=int(subject[3:]))
    return SeriesKey(node, metric, port=subject)


def _ramp(t: FloatArray, truth: Truth) -> FloatArray:
    if truth.onset is None or truth.fail_time is None:
        return np.zeros(len(t))
    span = truth.fail_time - truth.onset
    ramp: FloatArray = np.clip((t - truth.onset) / span, 0.0, 1.0)
    return ramp


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuforge.predict.generate``: write a telemetry file and its truth file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=300.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="telemetry (JSON Lines)")
    parser.add_argument("--truth", type=Path, required=True, help="failure times (JSON)")
    args = parser.parse_args(argv)
    fleet = GeneratedFleet(
        FleetSpec(nodes=args.nodes, days=args.days, step_s=args.step, seed=args.seed)
    )
    with args.out.open("w", encoding="utf-8") as out:
        lines = write_telemetry(fleet.telemetry(), out)
    args.truth.write_text(
        json.dumps(
            {
                "at": fleet.spec.at,
                "spec": asdict(fleet.spec),
                "nodes": [asdict(t) for t in fleet.truth.values()],
            },
            indent=1,
        )
    )
    sys.stderr.write(f"{args.out}: {lines} lines; {args.truth}: ground truth\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
