"""Nightly fleet conformance (issue 17): Slurm reaches the idle nodes, each checks itself.

``plan`` picks the idle nodes and writes the one ``sbatch`` call, ``judge`` turns each node's
record into a :class:`~gpuforge.history.conformance.NodeResult` (and compares firmware across the
node type), ``run`` drives one run (lock, Slurm or SSH, collection, admission, history),
``wiring`` connects a run to a real cluster (sbatch, the SSH transport, the collector, burn-in),
``report`` says what changed since the previous run (JSON, JUnit, HTML, Prometheus textfile).
docs/conformance.md explains the design and the figures.
"""

from __future__ import annotations
