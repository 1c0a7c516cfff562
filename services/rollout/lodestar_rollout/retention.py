"""Retention of finished runs: which runs expired, and an archive (a run's scored trajectories as Parquet,
the records `lodestar export` writes, at any reward) written before the run is deleted. Pure domain: the
service calls `archive` on its store thread and deletes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lodestar_rollout import sft_files
from lodestar_rollout.export import accepted_records
from lodestar_rollout.model import Run
from lodestar_rollout.store import Store

EVERY_REWARD = float("-inf")


@dataclass(frozen=True)
class Retention:
    period_s: float = 0.0
    """Finished runs are deleted this long after they finished (0: kept until deleted by hand)."""
    archive_dir: Path = Path(".lodestar/archive")
    """Where `archive` writes RUN_ID.parquet (on the rollout leader's host)."""

    @property
    def check_interval_s(self) -> float:
        """How often expired runs are looked for: a tenth of the period, between 1 s and 10 minutes."""
        return min(600.0, max(1.0, self.period_s / 10))


@dataclass(frozen=True)
class Archived:
    path: Path
    sessions: int
    """Scored sessions of the run."""
    records: int
    """Records written (one per chain end of a scored session)."""


def expired(runs: Iterable[Run], period_s: float, now: float) -> list[str]:
    """Finished runs that finished more than `period_s` ago (none when `period_s` is 0)."""
    if period_s <= 0:
        return []
    return [run.run_id for run in runs if run.finished and 0 < run.finished_at <= now - period_s]


def archive(store: Store, run_id: str, folder: Path) -> Archived:
    """Write every scored trajectory of `run_id` to `folder`/RUN_ID.parquet (blocking: the store's thread)."""
    records, stats = accepted_records(store, run_id, EVERY_REWARD)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_id}.parquet"
    sft_files.write(records, path, "parquet")
    return Archived(path.resolve(), stats.sessions, stats.records)
