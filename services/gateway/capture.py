"""The node's durable capture store: sessions and CallRecords in one SQLite file (WAL).

All database work runs on one dedicated thread with one connection, so the event loop never blocks on
disk. `append` returns only after the record is committed (group commit: records that arrive while a
commit is in flight are written together in the next transaction, one fsync for all of them). With
`synchronous=FULL` (the default) a committed record survives a crash of the process or the machine.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

from lodestar.v1 import common_pb2, gateway_pb2

Synchronous = Literal["full", "normal", "off"]
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL UNIQUE,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (session_id, sequence)
) WITHOUT ROWID;
"""


class CaptureStore:
    """Sessions and captured calls of one gateway node."""

    def __init__(self, path: Path, *, synchronous: Synchronous = "full") -> None:
        self.path = path
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-store")
        self._db: sqlite3.Connection | None = None
        self._pending: list[tuple[common_pb2.CallRecord, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        self._db = db

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)

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

    def _sessions(self) -> list[tuple[bytes, int]]:
        return (
            self._conn()
            .execute(
                "SELECT s.record, COALESCE((SELECT MAX(sequence) + 1 FROM calls c "
                "WHERE c.session_id = s.session_id), 0) FROM sessions s ORDER BY s.rowid"
            )
            .fetchall()
        )

    # Calls ---------------------------------------------------------------------------------------------

    async def append(self, record: common_pb2.CallRecord) -> None:
        """Write one record; returns once it is committed. The caller must not modify it afterwards."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((record, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._run(self._write, [record for record, _ in batch])
                except Exception as error:  # a disk error fails exactly the calls of this batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                else:
                    for _, future in batch:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._flusher = None

    def _write(self, records: list[common_pb2.CallRecord]) -> None:
        db = self._conn()
        rows = [(r.session_id, r.sequence, r.SerializeToString()) for r in records]
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO calls (session_id, sequence, record) VALUES (?, ?, ?)", rows)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def calls(self, session_id: str) -> list[common_pb2.CallRecord]:
        """The session's records in sequence order."""
        blobs: list[tuple[bytes]] = await self._run(self._calls, session_id)
        out = []
        for (blob,) in blobs:
            record = common_pb2.CallRecord()
            record.ParseFromString(blob)
            out.append(record)
        return out

    def _calls(self, session_id: str) -> list[tuple[bytes]]:
        return (
            self._conn()
            .execute("SELECT record FROM calls WHERE session_id = ? ORDER BY sequence", (session_id,))
            .fetchall()
        )
