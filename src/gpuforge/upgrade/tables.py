"""The tables of :mod:`gpuforge.upgrade.run` in the rollout record (``rollout.db``).

A leaf module (SQL only) so that :mod:`gpuforge.rollout.state`, which assembles the record's one
migration list, can name these steps without importing the upgrade (which imports it). A change
to these tables is a new step appended here and to ``ROLLOUT_SCHEMA``'s list.
"""

from __future__ import annotations

from gpuforge.database import Step

OWNER = "gpuforge.upgrade.run"

V1 = """
CREATE TABLE IF NOT EXISTS upgrades (
    id         TEXT PRIMARY KEY,
    pins       TEXT NOT NULL,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    status     TEXT NOT NULL,
    detail     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS upgrade_nodes (
    upgrade     TEXT NOT NULL REFERENCES upgrades(id),
    hostname    TEXT NOT NULL,
    wave        INTEGER NOT NULL,
    step        TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    started_at  REAL NOT NULL,
    drained_s   REAL,
    apply_s     REAL,
    validate_s  REAL,
    finished_at REAL,
    PRIMARY KEY (upgrade, hostname)
);
CREATE TABLE IF NOT EXISTS upgrade_waves (
    upgrade     TEXT NOT NULL REFERENCES upgrades(id),
    wave        INTEGER NOT NULL,
    nodes       TEXT NOT NULL,
    started_at  REAL NOT NULL,
    finished_at REAL,
    passed      INTEGER,
    detail      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (upgrade, wave)
);
"""
"""``IF NOT EXISTS``: a record written before the database module may already hold them (the
upgrade created them on first use then)."""

STEPS = (Step(OWNER, V1),)
