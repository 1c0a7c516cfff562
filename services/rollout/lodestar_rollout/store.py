"""Durable store of the rollout service: a small `Store` interface and its SQLite implementation.

One SQLite file in WAL mode (synchronous=NORMAL: a committed transaction survives a crash of the
process; `synchronous="full"` also survives power loss). Tables: runs (+ run_specs, written once; a run
row also holds when it finished and the trainer-pace estimate), groups, sessions (current state),
attempts (node, lease, outcome, stage timings), results (every node report with all its CallRecords, as
one serialized `SessionResult` blob, and whether it counted) and meta (the latest policy version).
`rows_for` snapshots what an operation changed on the event loop; `write` persists a batch of such
snapshots in one transaction (the service calls it on the store's own thread with every snapshot queued
since its last commit: a group commit).

`load` reads only what is live (every run, the groups not yet done and their sessions, plus per-run counts
of the rest); the other reads (`SqlReads`, the same SQL on SQLite and PostgreSQL) answer for the groups and
sessions that left the service's memory. `delete_run` removes every row of a run in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lodestar.v1 import rollout_pb2
from lodestar_rollout.model import (
    AttemptRecord,
    Changes,
    Group,
    GroupStatus,
    Run,
    Session,
    SessionStatus,
    StoredResult,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_specs (run_id TEXT PRIMARY KEY, spec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, ordinal INTEGER NOT NULL, created_at REAL NOT NULL, state INTEGER NOT NULL,
  groups_completed INTEGER NOT NULL, groups_delivered INTEGER NOT NULL, groups_dropped INTEGER NOT NULL,
  infra_failures INTEGER NOT NULL, stage_json TEXT NOT NULL, finished_at REAL NOT NULL DEFAULT 0,
  batch_estimate REAL NOT NULL DEFAULT 0, mark_version INTEGER NOT NULL DEFAULT 0,
  mark_delivered INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS groups (
  group_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_index INTEGER NOT NULL, required INTEGER NOT NULL,
  status TEXT NOT NULL, completion_seq INTEGER NOT NULL, delivery_seq INTEGER NOT NULL, dropped INTEGER NOT NULL,
  min_policy_version INTEGER NOT NULL, max_policy_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, group_id TEXT NOT NULL, task_index INTEGER NOT NULL,
  sample INTEGER NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL, failures INTEGER NOT NULL,
  node_id TEXT NOT NULL, lease_id INTEGER NOT NULL, stage INTEGER NOT NULL, outcome INTEGER NOT NULL,
  reward REAL NOT NULL, counted INTEGER NOT NULL, min_policy_version INTEGER NOT NULL,
  max_policy_version INTEGER NOT NULL, acquired_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
  session_id TEXT NOT NULL, attempt INTEGER NOT NULL, node_id TEXT NOT NULL, lease_id INTEGER NOT NULL,
  acquired_at REAL NOT NULL, ended_at REAL NOT NULL, outcome TEXT NOT NULL, error TEXT NOT NULL,
  stage_json TEXT NOT NULL, PRIMARY KEY (session_id, attempt));
CREATE TABLE IF NOT EXISTS results (
  session_id TEXT NOT NULL, attempt INTEGER NOT NULL, node_id TEXT NOT NULL, counted INTEGER NOT NULL,
  result BLOB NOT NULL, PRIMARY KEY (session_id, attempt, node_id));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_by_group ON sessions (group_id, sample);
CREATE INDEX IF NOT EXISTS sessions_by_run ON sessions (run_id, task_index, sample);
CREATE INDEX IF NOT EXISTS groups_by_delivery ON groups (run_id, delivery_seq);
"""
ADDED_RUN_COLUMNS = (
    ("finished_at", "REAL"),
    ("batch_estimate", "REAL"),
    ("mark_version", "INTEGER"),
    ("mark_delivered", "INTEGER"),
)
"""Columns added to `runs` after its first version: older stores get them on open (`ALTER TABLE`)."""
LIVE_GROUP = "(g.status = 'open' OR (g.status = 'complete' AND g.delivery_seq = 0 AND g.dropped = 0))"
"""SQL condition on `groups g`: the group is live (open, or complete and neither delivered nor dropped)."""


@dataclass
class Rows:
    """A snapshot of changed state, taken on the event loop, written later on the store thread."""

    specs: list[tuple[str, rollout_pb2.RunSpec]] = field(default_factory=list)
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    groups: list[tuple[Any, ...]] = field(default_factory=list)
    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    results: list[StoredResult] = field(default_factory=list)
    policy_version: int | None = None


@dataclass
class StoredState:
    runs: list[Run]
    groups: list[Group]
    sessions: list[Session]
    policy_version: int


class Store(Protocol):
    """What the rollout service needs from durable storage (`SqliteStore`; `PostgresStore` in pgstore.py)."""

    def load(self) -> StoredState: ...

    def write(self, batch: Sequence[Rows]) -> None: ...

    def counted_results(self, session_ids: Sequence[str]) -> list[rollout_pb2.SessionResult]: ...

    def attempts(self, session_id: str) -> list[AttemptRecord]: ...

    def shown_result(self, session_id: str) -> StoredResult | None:
        """The result to show for a session: the counted one, else the latest attempt's (None: no report)."""
        ...

    def failed_attempts(self, run_id: str, limit: int) -> list[AttemptRecord]:
        """The run's infra_failed and lost attempts, newest first, at most `limit` (0: all)."""
        ...

    def session(self, session_id: str) -> Session | None: ...

    def run_groups(self, run_id: str) -> list[tuple[Group, list[Session]]]:
        """Every group of the run (task order) with its sessions (sample order)."""
        ...

    def run_sessions(self, run_id: str) -> list[Session]:
        """Every session of the run (task, then sample order)."""
        ...

    def delivered_group(self, run_id: str, delivery_seq: int) -> Group | None:
        """The run's group delivered as `delivery_seq`, with its scored session ids only (sample order)."""
        ...

    def run_spec(self, run_id: str) -> rollout_pb2.RunSpec | None: ...

    def delete_run(self, run_id: str) -> None:
        """Delete every row of the run (results, attempts, sessions, groups, run, spec) in one transaction."""
        ...

    def close(self) -> None: ...


def rows_for(changes: Changes, runs: dict[str, Run], groups: dict[str, Group], sessions: dict[str, Session]) -> Rows:
    """Snapshot the rows `changes` touched (values copied: the state may change while they are written)."""
    rows = Rows(attempts=list(changes.attempts), results=list(changes.results), policy_version=changes.policy_version)
    rows.specs = [(run_id, runs[run_id].spec) for run_id in changes.created]
    for run_id in changes.runs:
        r = runs[run_id]
        stages = json.dumps({"sums": r.stage_sums, "counts": r.stage_counts})
        rows.runs.append(
            (
                r.run_id,
                r.ordinal,
                r.created_at,
                r.state,
                r.groups_completed,
                r.groups_delivered,
                r.groups_dropped,
                r.infra_failures,
                stages,
                r.finished_at,
                r.batch_estimate,
                r.version_mark[0],
                r.version_mark[1],
            )
        )
    for group_id in changes.groups:
        g = groups[group_id]
        rows.groups.append(
            (
                g.group_id,
                g.run_id,
                g.task_index,
                g.required,
                g.status.value,
                g.completion_seq,
                g.delivery_seq,
                int(g.dropped),
                g.min_policy_version,
                g.max_policy_version,
            )
        )
    for session_id in changes.sessions:
        s = sessions[session_id]
        rows.sessions.append(
            (
                s.session_id,
                s.run_id,
                s.group_id,
                s.task_index,
                s.sample,
                s.status.value,
                s.attempt,
                s.failures,
                s.node_id,
                s.lease_id,
                s.stage,
                s.outcome,
                s.reward,
                int(s.counted),
                s.min_policy_version,
                s.max_policy_version,
                s.acquired_at,
            )
        )
    return rows


SHOWN_RESULT_SQL = (
    "SELECT result, counted FROM results WHERE session_id = ? ORDER BY counted DESC, attempt DESC LIMIT 1"
)
FAILED_ATTEMPTS_SQL = (
    "SELECT a.* FROM attempts a JOIN sessions s ON s.session_id = a.session_id "
    "WHERE s.run_id = ? AND a.outcome IN ('infra_failed', 'lost') ORDER BY a.ended_at DESC LIMIT ?"
)
"""Read-only queries of the dashboard views, in SQLite's `?` style (pgstore swaps in `%s`)."""
NO_LIMIT = 1 << 62


def attempt_record(row: Sequence[Any]) -> AttemptRecord:
    """An `attempts` row (columns in schema order) as an AttemptRecord."""
    return AttemptRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], json.loads(row[8]))


def stored_result(row: Sequence[Any] | None) -> StoredResult | None:
    """A (result blob, counted) row as a StoredResult."""
    return None if row is None else StoredResult(rollout_pb2.SessionResult.FromString(row[0]), bool(row[1]))


TABLES = ("run_specs", "runs", "groups", "sessions", "attempts", "results", "meta")
"""Every table, in the order a snapshot is written."""
_SQLITE_UPSERT = {
    "run_specs": "INSERT OR IGNORE INTO run_specs VALUES (?, ?)",
    "runs": "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "groups": "INSERT OR REPLACE INTO groups VALUES (?,?,?,?,?,?,?,?,?,?)",
    "sessions": "INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "attempts": "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?)",
    "results": "INSERT OR REPLACE INTO results VALUES (?,?,?,?,?)",
    "meta": "INSERT OR REPLACE INTO meta VALUES (?, ?)",
}


def table_rows(rows: Rows) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The row tuples of a snapshot per table (in `TABLES` order), as both stores write them."""
    specs: list[tuple[Any, ...]] = [(run_id, spec.SerializeToString()) for run_id, spec in rows.specs]
    attempts: list[tuple[Any, ...]] = [
        (
            a.session_id,
            a.attempt,
            a.node_id,
            a.lease_id,
            a.acquired_at,
            a.ended_at,
            a.outcome,
            a.error,
            json.dumps(a.stage_seconds),
        )
        for a in rows.attempts
    ]
    results: list[tuple[Any, ...]] = [
        (r.result.session_id, r.result.attempt, r.result.node_id, int(r.counted), r.result.SerializeToString())
        for r in rows.results
    ]
    meta: list[tuple[Any, ...]] = (
        [("policy_version", str(rows.policy_version))] if rows.policy_version is not None else []
    )
    return [
        ("run_specs", specs),
        ("runs", rows.runs),
        ("groups", rows.groups),
        ("sessions", rows.sessions),
        ("attempts", attempts),
        ("results", results),
        ("meta", meta),
    ]


class SqlReads:
    """The reads both stores share, written once in SQLite's `?` style: a store supplies `_all` (SQL,
    parameters -> every row; PostgreSQL swaps in `%s`) and `_transaction` (statements in one transaction)."""

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        raise NotImplementedError

    def attempts(self, session_id: str) -> list[AttemptRecord]:
        rows = self._all("SELECT * FROM attempts WHERE session_id = ? ORDER BY attempt", (session_id,))
        return [attempt_record(r) for r in rows]

    def shown_result(self, session_id: str) -> StoredResult | None:
        rows = self._all(SHOWN_RESULT_SQL, (session_id,))
        return stored_result(rows[0] if rows else None)

    def failed_attempts(self, run_id: str, limit: int) -> list[AttemptRecord]:
        rows = self._all(FAILED_ATTEMPTS_SQL, (run_id, limit or NO_LIMIT))
        return [attempt_record(r) for r in rows]

    def session(self, session_id: str) -> Session | None:
        rows = self._all("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        return session_from_row(rows[0]) if rows else None

    def run_sessions(self, run_id: str) -> list[Session]:
        rows = self._all("SELECT * FROM sessions WHERE run_id = ? ORDER BY task_index, sample", (run_id,))
        return [session_from_row(r) for r in rows]

    def run_groups(self, run_id: str) -> list[tuple[Group, list[Session]]]:
        members: dict[str, list[Session]] = {}
        for session in self.run_sessions(run_id):
            members.setdefault(session.group_id, []).append(session)
        out = []
        for r in self._all("SELECT * FROM groups WHERE run_id = ? ORDER BY task_index", (run_id,)):
            sessions = members.get(r[0], [])
            out.append((group_from_row(r, [s.session_id for s in sessions]), sessions))
        return out

    def delivered_group(self, run_id: str, delivery_seq: int) -> Group | None:
        rows = self._all("SELECT * FROM groups WHERE run_id = ? AND delivery_seq = ?", (run_id, delivery_seq))
        if not rows:
            return None
        scored = self._all(
            "SELECT session_id FROM sessions WHERE group_id = ? AND status = ? ORDER BY sample",
            (rows[0][0], SessionStatus.SCORED.value),
        )
        return group_from_row(rows[0], [r[0] for r in scored])

    def run_spec(self, run_id: str) -> rollout_pb2.RunSpec | None:
        rows = self._all("SELECT spec FROM run_specs WHERE run_id = ?", (run_id,))
        return rollout_pb2.RunSpec.FromString(bytes(rows[0][0])) if rows else None

    def delete_run(self, run_id: str) -> None:
        of_run = "(SELECT session_id FROM sessions WHERE run_id = ?)"
        self._transaction(
            [
                (f"DELETE FROM results WHERE session_id IN {of_run}", (run_id,)),
                (f"DELETE FROM attempts WHERE session_id IN {of_run}", (run_id,)),
                ("DELETE FROM sessions WHERE run_id = ?", (run_id,)),
                ("DELETE FROM groups WHERE run_id = ?", (run_id,)),
                ("DELETE FROM runs WHERE run_id = ?", (run_id,)),
                ("DELETE FROM run_specs WHERE run_id = ?", (run_id,)),
            ]
        )

    def load(self) -> StoredState:
        return load_state(self._all)


JOURNAL_SIZE_LIMIT = 64 << 20
"""Bytes the rollout store's WAL file is truncated to after a checkpoint rewinds it."""


class SqliteStore(SqlReads):
    """The `Store` on one SQLite file. Not thread-safe: use it from one thread at a time."""

    def __init__(self, path: Path, *, synchronous: str = "normal") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA busy_timeout=10000")
        # A WAL that an outside reader let grow is cut back to this after the next checkpoint (docs/runs.md).
        self._db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        self._db.executescript(_SCHEMA.split("CREATE INDEX")[0])
        present = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        for name, kind in ADDED_RUN_COLUMNS:
            if name not in present:
                self._db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind} NOT NULL DEFAULT 0")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def write(self, batch: Sequence[Rows]) -> None:
        """Persist every snapshot of `batch`, in order, in one transaction (a group commit)."""
        self._transaction([(_SQLITE_UPSERT[table], values) for rows in batch for table, values in table_rows(rows)])

    def _transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run `statements` in one transaction; a statement whose parameters are a list of tuples runs once
        per tuple (none: skipped)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                if params and isinstance(params, list):
                    db.executemany(sql, params)
                elif not isinstance(params, list):
                    db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, params).fetchall()

    def counted_results(self, session_ids: Sequence[str]) -> list[rollout_pb2.SessionResult]:
        """The counted result of each session, in the order given (sessions without one are skipped)."""
        found: dict[str, rollout_pb2.SessionResult] = {}
        for session_id in session_ids:
            row = self._db.execute(
                "SELECT result FROM results WHERE session_id = ? AND counted = 1", (session_id,)
            ).fetchone()
            if row is not None:
                found[session_id] = rollout_pb2.SessionResult.FromString(row[0])
        return [found[sid] for sid in session_ids if sid in found]


def session_from_row(r: Sequence[Any]) -> Session:
    """A `sessions` row (columns in schema order) as a Session."""
    # Kept as laid out (the skip below): the columns in schema order read as one row (missed_polls, 0, is not stored).
    return Session(
        r[0], r[1], r[2], r[3], r[4], SessionStatus(r[5]), r[6], r[7], r[8], r[9], r[10], 0, r[11], r[12],
        bool(r[13]), r[14], r[15], r[16],
    )  # fmt: skip


def group_from_row(r: Sequence[Any], session_ids: list[str]) -> Group:
    """A `groups` row (columns in schema order) with its session ids as a Group."""
    return Group(r[0], r[1], r[2], session_ids, r[3], GroupStatus(r[4]), r[5], r[6], bool(r[7]), r[8], r[9])


def load_state(query: Callable[[str], Sequence[Sequence[Any]]]) -> StoredState:
    """The live state from `query` (SQL -> all rows; the same SQL on SQLite and PostgreSQL): every run, the
    live groups and their sessions, and in each run's `retired` tally the counts of its other sessions."""
    specs = {run_id: rollout_pb2.RunSpec.FromString(bytes(blob)) for run_id, blob in query("SELECT * FROM run_specs")}
    runs: dict[str, Run] = {}
    for row in query("SELECT * FROM runs ORDER BY ordinal"):
        stages = json.loads(row[8])
        run = Run(row[0], row[1], specs[row[0]], row[2], row[3])
        run.groups_completed, run.groups_delivered, run.groups_dropped, run.infra_failures = row[4:8]
        run.stage_sums, run.stage_counts = stages["sums"], stages["counts"]
        run.finished_at, run.batch_estimate, run.version_mark = row[9], row[10], (row[11], row[12])
        runs[row[0]] = run
    sessions = [
        session_from_row(r)
        for r in query(
            f"SELECT s.* FROM sessions s JOIN groups g ON g.group_id = s.group_id WHERE {LIVE_GROUP} "
            "ORDER BY s.run_id, s.task_index, s.sample"
        )
    ]
    members: dict[str, list[str]] = {}
    for session in sessions:
        members.setdefault(session.group_id, []).append(session.session_id)
    group_list = []
    for r in query(f"SELECT g.* FROM groups g WHERE {LIVE_GROUP} ORDER BY g.run_id, g.task_index"):
        group_list.append(group_from_row(r, members.get(r[0], [])))
        runs[r[1]].group_ids[r[0]] = None
    retired = query(
        "SELECT s.run_id, s.status, s.outcome, COUNT(*), SUM(s.reward) FROM sessions s "
        f"JOIN groups g ON g.group_id = s.group_id WHERE NOT {LIVE_GROUP} GROUP BY s.run_id, s.status, s.outcome"
    )
    for run_id, status, outcome, count, reward_sum in retired:
        runs[run_id].retired.add(SessionStatus(status), outcome, float(reward_sum or 0.0), int(count))
    meta = query("SELECT value FROM meta WHERE key = 'policy_version'")
    return StoredState(list(runs.values()), group_list, sessions, int(meta[0][0]) if meta else 0)
