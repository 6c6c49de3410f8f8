"""Where one cluster's state lives on the admin host: its databases, locks and reports.

Everything gpuforge keeps about a cluster is under ``<state dir>/<cluster>/`` (``--state-dir``,
default ``state/`` or ``$GPUFORGE_STATE_DIR``)::

    rollout.db        the rollout record (gpuforge.rollout.state; the upgrade's tables too)
    rollout.lock      one operator at a time (gpuforge.rollout.lock), beside it rollout.play
    admission.db      maintenance windows and admission actions (gpuforge.admission)
    history.db        the health history and conformance runs (gpuforge.history)
    collector.lock    its one collector (one writer of records per history; gpuforge.health)
    conformance.lock  one nightly conformance run at a time

and its reports under ``<report dir>/<cluster>/`` (``--report-dir``, default ``reports/``), one
folder per run. :class:`StatePaths` names each of these once; the stores open what it names.
Paths only (nothing is created by naming them): this module imports nothing of gpuforge, so
every layer can use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The state directory when neither ``--state-dir`` nor ``$GPUFORGE_STATE_DIR`` says.
DEFAULT_STATE_DIR = Path("state")
#: The report directory when ``--report-dir`` does not say.
DEFAULT_REPORT_DIR = Path("reports")
STATE_DIR_ENV = "GPUFORGE_STATE_DIR"

ROLLOUT_DB = "rollout.db"
ADMISSION_DB = "admission.db"
HISTORY_DB = "history.db"
ROLLOUT_LOCK = "rollout.lock"
CONFORMANCE_LOCK = "conformance.lock"
COLLECTOR_LOCK = "collector.lock"


def play_record_of(lock: Path) -> Path:
    """Where the holder of ``lock`` records its play's process group: ``<lock stem>.play``."""
    return lock.with_name(f"{lock.stem}.play")


def collector_lock_of(history_db: Path) -> Path:
    """The lock of the one collector writing the history ``history_db``: beside it."""
    return Path(history_db).with_name(COLLECTOR_LOCK)


def default_state_dir() -> Path:
    """``$GPUFORGE_STATE_DIR``, else ``state/``."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


@dataclass(frozen=True)
class StatePaths:
    """The state and report paths of one cluster."""

    state_dir: Path
    cluster: str
    report_dir: Path = DEFAULT_REPORT_DIR

    @property
    def root(self) -> Path:
        """``<state dir>/<cluster>``: the cluster's folder of databases and locks."""
        return Path(self.state_dir) / self.cluster

    @property
    def rollout_db(self) -> Path:
        """The rollout record (:func:`gpuforge.rollout.state.open_store`)."""
        return self.root / ROLLOUT_DB

    @property
    def admission_db(self) -> Path:
        """The admission record (:class:`gpuforge.admission.AdmissionRecord`)."""
        return self.root / ADMISSION_DB

    @property
    def history_db(self) -> Path:
        """The history database (:meth:`gpuforge.history.store.HistoryStore.open`)."""
        return self.root / HISTORY_DB

    @property
    def lock(self) -> Path:
        """The cluster lock (:func:`~gpuforge.rollout.lock.cluster_lock`): deploy, upgrade, ..."""
        return self.root / ROLLOUT_LOCK

    @property
    def play_record(self) -> Path:
        """Where the holder of :attr:`lock` records the process group of its running play."""
        return play_record_of(self.lock)

    @property
    def conformance_lock(self) -> Path:
        """The lock of nightly conformance runs."""
        return self.root / CONFORMANCE_LOCK

    @property
    def collector_lock(self) -> Path:
        """The lock of the collector writing :attr:`history_db` (one per history)."""
        return collector_lock_of(self.history_db)

    @property
    def reports(self) -> Path:
        """``<report dir>/<cluster>``: one folder per run below it."""
        return Path(self.report_dir) / self.cluster

    @classmethod
    def clusters_with(cls, state_dir: Path, name: str) -> list[str]:
        """The clusters under ``state_dir`` that have file ``name`` (``history.db``), sorted."""
        return sorted(p.parent.name for p in Path(state_dir).glob(f"*/{name}") if p.is_file())
