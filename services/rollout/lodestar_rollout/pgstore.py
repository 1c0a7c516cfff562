"""The rollout `Store` on PostgreSQL (psycopg 3): for a rollout leader and standby on different hosts.

Same tables and row tuples as the SQLite store (`store.table_rows`, `store.load_state`); text columns
use the "C" collation so ordered reads match SQLite's byte order, blobs are BYTEA, numbers BIGINT and
DOUBLE PRECISION. A group commit is one transaction (PostgreSQL's default synchronous_commit makes it
durable once `write` returns); "insert or replace" is `ON CONFLICT (key) DO UPDATE`. Only this module
imports psycopg. Selected by a `postgresql://` URL in `--store` (see `stores.open_store`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from lodestar import errors
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_rollout.store import _SCHEMA, ADDED_RUN_COLUMNS, Rows, SqlReads, table_rows

CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 60_000
_log = get_logger("rollout.pgstore")

_KEYS = {
    "run_specs": ("run_id",),
    "runs": ("run_id",),
    "groups": ("group_id",),
    "sessions": ("session_id",),
    "attempts": ("session_id", "attempt"),
    "results": ("session_id", "attempt", "node_id"),
    "meta": ("key",),
}


def _pg_types(sql: str) -> str:
    sql = sql.replace(" TEXT", ' TEXT COLLATE "C"').replace(" BLOB", " BYTEA")
    return sql.replace(" INTEGER", " BIGINT").replace(" REAL", " DOUBLE PRECISION")


def _pg_schema() -> list[str]:
    """The schema's statements, then those adding the columns an older store lacks."""
    added = [
        _pg_types(f"ALTER TABLE runs ADD COLUMN IF NOT EXISTS {name} {kind} NOT NULL DEFAULT 0")
        for name, kind in ADDED_RUN_COLUMNS
    ]
    return [statement for statement in _pg_types(_SCHEMA).split(";") if statement.strip()] + added


_COLUMNS = {
    "run_specs": "run_id spec",
    "runs": "run_id ordinal created_at state groups_completed groups_delivered groups_dropped infra_failures "
    "stage_json finished_at batch_estimate mark_version mark_delivered",
    "groups": "group_id run_id task_index required status completion_seq delivery_seq dropped min_policy_version "
    "max_policy_version",
    "sessions": "session_id run_id group_id task_index sample status attempt failures node_id lease_id stage outcome "
    "reward counted min_policy_version max_policy_version acquired_at",
    "attempts": "session_id attempt node_id lease_id acquired_at ended_at outcome error stage_json",
    "results": "session_id attempt node_id counted result",
    "meta": "key value",
}
"""Columns of each table in the order of `store.table_rows` tuples (= the SQLite schema's order)."""


def _upserts() -> dict[str, str]:
    sql: dict[str, str] = {}
    for table, spaced in _COLUMNS.items():
        names = spaced.split()
        keys = _KEYS[table]
        updates = ", ".join(f"{name} = EXCLUDED.{name}" for name in names if name not in keys)
        action = "DO NOTHING" if table == "run_specs" else f"DO UPDATE SET {updates}"
        sql[table] = (
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))}) "
            f"ON CONFLICT ({', '.join(keys)}) {action}"
        )
    return sql


_UPSERT = _upserts()


class PostgresStore(SqlReads):
    """The `Store` on a PostgreSQL database; one connection, calls serialized by a lock."""

    def __init__(self, url: str, *, connect_timeout: int = CONNECT_TIMEOUT_S) -> None:
        self.url = url
        try:
            self._db = psycopg.connect(
                url,
                autocommit=True,
                connect_timeout=connect_timeout,
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            )
        except psycopg.OperationalError as error:
            raise errors.UnavailableError(f"cannot connect to the PostgreSQL store: {_brief(error)}") from error
        self._lock = threading.Lock()
        with self._lock, self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(7470127)")  # concurrent first starts create once
            for statement in _pg_schema():
                self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def write(self, batch: Sequence[Rows]) -> None:
        """Persist every snapshot of `batch`, in order, in one transaction (a group commit)."""
        with self._lock, self._db.transaction(), self._db.cursor() as cursor:
            for rows in batch:
                for table, values in table_rows(rows):
                    if values:
                        cursor.executemany(_UPSERT[table], values)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql.replace("?", "%s"), params).fetchall()

    def _transaction(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        with self._lock, self._db.transaction(), self._db.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql.replace("?", "%s"), params)

    def counted_results(self, session_ids: Sequence[str]) -> list[rollout_pb2.SessionResult]:
        """The counted result of each session, in the order given (sessions without one are skipped)."""
        rows = self._all(
            "SELECT session_id, result FROM results WHERE session_id = ANY(?) AND counted = 1", (list(session_ids),)
        )
        found = {session_id: rollout_pb2.SessionResult.FromString(blob) for session_id, blob in rows}
        return [found[sid] for sid in session_ids if sid in found]


def _brief(error: BaseException) -> str:
    """The first line of a driver error, without the connection string (it may hold a password)."""
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
