"""The tables of :mod:`gpuforge.history.conformance` in the history database (``history.db``).

A leaf module (SQL only) so that :mod:`gpuforge.history.store`, which assembles the database's
one migration list, can name these steps without importing the conformance module (which imports
it). A change to these tables is a new step appended here and to the store's list.
"""

from __future__ import annotations

from gpuforge.database import Step

OWNER = "gpuforge.history.conformance"

V1 = """
CREATE TABLE IF NOT EXISTS conformance_runs (
    id INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    level TEXT NOT NULL,
    state TEXT NOT NULL,          -- running | complete | partial
    nodes INTEGER NOT NULL,       -- nodes of the cluster at the start
    counts TEXT NOT NULL DEFAULT '{}',  -- JSON {outcome: nodes}, kept after pruning
    meta TEXT NOT NULL DEFAULT '{}'     -- JSON: job id, transport, sbatch calls, notes
);
CREATE TABLE IF NOT EXISTS conformance_results (
    node TEXT NOT NULL,
    run_id INTEGER NOT NULL REFERENCES conformance_runs (id),
    outcome TEXT NOT NULL,
    why TEXT NOT NULL DEFAULT '',       -- not_checked / error: the reason, fail: the checks
    failed TEXT NOT NULL DEFAULT '[]',  -- JSON [[check, status, action], ...] not passing
    drift TEXT NOT NULL DEFAULT '[]',   -- JSON [[kind, item, desired, actual], ...]
    PRIMARY KEY (node, run_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS conformance_results_run ON conformance_results (run_id, outcome);
"""
"""``IF NOT EXISTS``: a history written before the database module may already hold them
(conformance created them on first use then)."""

STEPS = (Step(OWNER, V1),)
