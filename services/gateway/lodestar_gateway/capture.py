"""The node's durable capture store: sessions and CallRecords in one SQLite file (WAL).

All database work runs on one dedicated thread with one connection, so the event loop never blocks on
disk. `append` returns only after the record is committed (group commit: records that arrive while a
commit is in flight are written together in the next transaction, one fsync for all of them).
Durability is SQLite's `synchronous` mode: `normal` (the default) — a committed record survives any crash
of the gateway process (the WAL is written before `append` returns; SIGKILL-tested); the last commits
can be lost only if the operating system itself dies, which also kills the harness run they belong to
(rollout retries such a session). `full` — every commit is also fsynced (survives power loss; costs an
fsync, shared by all records of a group commit; its time: docs/benchmarks.md).

WAL. Commits never checkpoint (`wal_autocheckpoint=0`): after about `WalPolicy.checkpoint_bytes` of new
data, `WalCheckpointer` copies the WAL into the database on a second connection, concurrently with new commits,
then rewinds it between two transactions of the writer thread, so the WAL file stays bounded under continuous
writes (`services/gateway/lodestar_gateway/wal_checkpoint.py`).

Retention. A session handed to `expire(session_id, at)` is deleted with its calls by the first `prune(now)`
after `at` (the node expires its sessions once rollout holds their results: `lodestar_gateway/retention.py`).
SQLite reuses the freed pages, so the file stays as large as the sessions it holds at once, not as large as
every session the node ever ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

from lodestar.errors import UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import common_pb2, gateway_pb2
from lodestar_gateway.wal_checkpoint import CheckpointResult, WalCheckpointer, WalPolicy

Synchronous = Literal["full", "normal", "off"]
_Operation = tuple[str, str, common_pb2.CallRecord | Callable[[], common_pb2.CallRecord] | None]
PAGE_SIZE = 16384
"""Records are 10s-100s of KB: bigger pages write them faster."""
_log = get_logger("gateway.capture")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL UNIQUE,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    call_id TEXT PRIMARY KEY,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    call_id TEXT NOT NULL UNIQUE,
    record BLOB NOT NULL,
    PRIMARY KEY (session_id, sequence)
);
CREATE TABLE IF NOT EXISTS expiry (
    session_id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS expiry_at ON expiry (expires_at);
"""
PRUNE_BATCH = 200
"""Sessions deleted per transaction (the writer thread is shared with the calls being captured)."""


class CaptureStore:
    """Sessions and captured calls of one gateway node."""

    def __init__(self, path: Path, *, synchronous: Synchronous = "normal", wal: WalPolicy | None = None) -> None:
        self.path = path
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-store")
        self._db: sqlite3.Connection | None = None
        self._pending: list[tuple[_Operation, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-checkpoint")
        self._wal = WalCheckpointer(path, synchronous=synchronous, policy=wal or WalPolicy(), page_size=PAGE_SIZE)
        self._checkpointing: asyncio.Task[CheckpointResult] | None = None
        self._wal_bytes = 0
        self.checkpoints: list[CheckpointResult] = []
        """The latest checkpoints (for status and tests; the last 64)."""

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        db.execute("PRAGMA journal_mode=WAL")
        self._wal.configure(db)  # no checkpoint inside a commit; the WAL's size limit
        db.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        self._db = db
        self._wal.open()

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):  # logged by `_checkpoint_done`
                await self._checkpointing
        await self._run(self._wal.close)
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("capture store is not open")
        return self._db

    # Sessions ------------------------------------------------------------------------------------------

    async def put_session(self, session: gateway_pb2.Session) -> None:
        """Insert or update a session (durable on return)."""
        await self._run(self._put_session, session.session_id, session.session_key, session.SerializeToString())

    def _put_session(self, session_id: str, key: str, blob: bytes) -> None:
        self._conn().execute(
            "INSERT INTO sessions (session_id, session_key, record) VALUES (?, ?, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET record = excluded.record",
            (session_id, key, blob),
        )

    async def sessions(self) -> list[tuple[gateway_pb2.Session, int]]:
        """Every session with its number of captured calls (next sequence number)."""
        rows: list[tuple[bytes, int]] = await self._run(self._sessions)
        out = []
        for blob, count in rows:
            session = gateway_pb2.Session()
            session.ParseFromString(blob)
            out.append((session, count))
        return out

    async def session(self, value: str) -> tuple[gateway_pb2.Session, int] | None:
        """One session by id or by key, with its number of captured calls (None when unknown)."""
        row: tuple[bytes, int] | None = await self._run(self._session, value)
        if row is None:
            return None
        session = gateway_pb2.Session()
        session.ParseFromString(row[0])
        return session, row[1]

    def _session(self, value: str) -> tuple[bytes, int] | None:
        row: tuple[bytes, int] | None = (
            self._conn()
            .execute(
                "SELECT s.record, COALESCE((SELECT MAX(sequence) + 1 FROM calls c "
                "WHERE c.session_id = s.session_id), 0) FROM sessions s WHERE s.session_id = ? OR s.session_key = ?",
                (value, value),
            )
            .fetchone()
        )
        return row

    def _sessions(self) -> list[tuple[bytes, int]]:
        return (
            self._conn()
            .execute(
                "SELECT s.record, COALESCE((SELECT MAX(sequence) + 1 FROM calls c "
                "WHERE c.session_id = s.session_id), 0) FROM sessions s ORDER BY s.rowid"
            )
            .fetchall()
        )

    # Retention -----------------------------------------------------------------------------------------

    async def expire(self, session_id: str, at: float) -> None:
        """Delete `session_id` and its calls at the first `prune` after `at` (wall-clock seconds); a session
        expired twice keeps the later time."""
        await self._run(self._expire, session_id, at)

    def _expire(self, session_id: str, at: float) -> None:
        self._conn().execute(
            "INSERT INTO expiry (session_id, expires_at) VALUES (?, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET expires_at = MAX(expires_at, excluded.expires_at)",
            (session_id, at),
        )

    async def prune(self, now: float) -> list[str]:
        """Delete every session (its record, calls and request halves) whose expiry time has passed; their ids."""
        pruned: list[str] = []
        while True:
            batch: list[str] = await self._run(self._prune, now)
            pruned += batch
            if len(batch) < PRUNE_BATCH:
                return pruned

    def _prune(self, now: float) -> list[str]:
        db = self._conn()
        ids = [
            row[0]
            for row in db.execute(
                "SELECT session_id FROM expiry WHERE expires_at <= ? ORDER BY expires_at LIMIT ?", (now, PRUNE_BATCH)
            )
        ]
        if not ids:
            return ids
        marks = ",".join("?" * len(ids))
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                f"DELETE FROM requests WHERE call_id IN (SELECT call_id FROM calls WHERE session_id IN ({marks}))", ids
            )
            for table in ("calls", "sessions", "expiry"):
                db.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})", ids)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self._wal_bytes += PAGE_SIZE * len(ids)  # the pages a deletion rewrites (roughly)
        return ids

    async def stored(self) -> tuple[int, int]:
        """(sessions, calls) the store holds."""
        row: tuple[int, int] = await self._run(
            lambda: (
                self._conn().execute("SELECT (SELECT COUNT(*) FROM sessions), (SELECT COUNT(*) FROM calls)").fetchone()
            )
        )
        return row

    # Calls ---------------------------------------------------------------------------------------------
    #
    # A CallRecord is written in two halves that together serialize to the whole record (protobuf merges
    # concatenated messages): the request half (original body, canonical messages, tools, sampling) while
    # inference is still generating, and the result half (token ids, logprobs, completion, sequence) when
    # the final arrives. Only the small result half is on the response's critical path; both are committed
    # before `append` returns. A request half whose call is never answered is discarded.

    async def begin(self, call_id: str, request_half: Callable[[], common_pb2.CallRecord]) -> None:
        """Write the request half of a call, built by `request_half()` on the writer thread (committed on
        return; the caller need not wait right away). What it reads must not change afterwards."""
        await self._submit(("begin", call_id, request_half))

    async def append(self, call_id: str, result_half: common_pb2.CallRecord) -> None:
        """Write the result half (with `session_id` and `sequence`); returns once the whole record is
        committed. `begin(call_id, ...)` must have been submitted first. Records are never modified after."""
        await self._submit(("append", call_id, result_half))

    async def discard(self, call_id: str) -> None:
        """Drop the request half of a call that was not answered."""
        await self._submit(("discard", call_id, None))

    async def _submit(self, operation: _Operation) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((operation, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._run(self._write, [operation for operation, _ in batch])
                except Exception as error:  # a disk error fails exactly the calls of this batch
                    _log.error("capture write failed", error=str(error))
                    failure = UnavailableError(f"the capture store cannot write ({error}); retry")
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(failure)
                else:
                    for _, future in batch:
                        if not future.done():
                            future.set_result(None)
            if self._wal_bytes > self._wal.policy.checkpoint_bytes and self._checkpointing is None:
                self._wal_bytes = 0
                self._checkpointing = asyncio.create_task(self._wal.checkpoint(self._on_checkpointer, self._run))
                self._checkpointing.add_done_callback(self._checkpoint_done)
        finally:
            self._flusher = None

    async def _on_checkpointer(self, fn: Callable[[], T]) -> T:
        """The checkpointer's PASSIVE rounds run on their own thread, concurrently with commits."""
        return await asyncio.get_running_loop().run_in_executor(self._checkpointer, fn)

    def _checkpoint_done(self, task: asyncio.Task[CheckpointResult]) -> None:
        self._checkpointing = None
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            _log.warning("capture checkpoint failed", error=str(error))
            return
        self.checkpoints = [*self.checkpoints[-63:], task.result()]

    def _write(self, operations: list[_Operation]) -> None:
        """One transaction (one commit, one fsync under synchronous=full) for a batch, in order."""
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            for kind, call_id, record in operations:
                if kind == "begin" and callable(record):
                    blob = record().SerializeToString()
                    db.execute("INSERT INTO requests (call_id, record) VALUES (?, ?)", (call_id, blob))
                    self._wal_bytes += len(blob)
                elif kind == "append" and isinstance(record, common_pb2.CallRecord):
                    blob = record.SerializeToString()
                    db.execute(
                        "INSERT INTO calls (session_id, sequence, call_id, record) VALUES (?, ?, ?, ?)",
                        (record.session_id, record.sequence, call_id, blob),
                    )
                    self._wal_bytes += len(blob)
                elif kind == "discard":
                    db.execute("DELETE FROM requests WHERE call_id = ?", (call_id,))
                    self._wal_bytes += PAGE_SIZE
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def calls(self, session_id: str) -> list[common_pb2.CallRecord]:
        """The session's records in sequence order."""
        rows: list[tuple[bytes, bytes]] = await self._run(self._calls, session_id)
        out = []
        for request_half, result_half in rows:
            record = common_pb2.CallRecord()
            record.ParseFromString(request_half + result_half)
            out.append(record)
        return out

    def _calls(self, session_id: str) -> list[tuple[bytes, bytes]]:
        return (
            self._conn()
            .execute(
                "SELECT r.record, c.record FROM calls c JOIN requests r ON r.call_id = c.call_id "
                "WHERE c.session_id = ? ORDER BY c.sequence",
                (session_id,),
            )
            .fetchall()
        )
