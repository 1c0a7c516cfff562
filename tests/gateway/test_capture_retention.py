"""Retention of the capture store (lodestar_gateway/capture.py, retention.py) on a real SQLite file: an expired
session leaves with its calls and request halves, an unexpired one stays, and the file stops growing once
sessions leave as fast as they come."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from lodestar.errors import NotFoundError
from lodestar.v1 import common_pb2, gateway_pb2
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.retention import Retention, RetentionPolicy
from lodestar_gateway.sessions import SessionRegistry

BODY = "x" * 20_000
"""A request body of a typical agent call (tens of KB)."""


async def _session_with_calls(store: CaptureStore, sessions: SessionRegistry, calls: int) -> str:
    entry = await sessions.open(run_id="r", labels={"rollout_session_id": "s"})
    for sequence in range(calls):
        call_id = secrets.token_hex(8)
        await store.begin(call_id, lambda: common_pb2.CallRecord(original_request_json=BODY))
        await store.append(call_id, common_pb2.CallRecord(session_id=entry.session_id, sequence=sequence))
    await sessions.close(entry.session_id)
    return entry.session_id


async def test_expired_sessions_leave_with_their_calls_and_others_stay(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "capture.sqlite")
    await store.open()
    sessions = SessionRegistry(store)
    retention = Retention(store, sessions, RetentionPolicy(acknowledged_s=0, unacknowledged_s=3600))
    try:
        done = await _session_with_calls(store, sessions, 3)
        unreported = await _session_with_calls(store, sessions, 2)
        running = await _session_with_calls(store, sessions, 1)
        assert await store.stored() == (3, 6)

        await retention.reported(done, acknowledged=True)
        await retention.reported(unreported, acknowledged=False)
        assert await retention.sweep() == 1

        assert await store.stored() == (2, 3)
        assert await store.calls(done) == []
        assert await store.session(done) is None
        assert [c.sequence for c in await store.calls(unreported)] == [0, 1], "kept: rollout never took it"
        assert len(await store.calls(running)) == 1
        orphans = await store._run(lambda: store._conn().execute("SELECT COUNT(*) FROM requests").fetchone()[0])
        assert orphans == 3, "the deleted calls' request halves went with them"
        assert await store.prune(time.time() + 7200) == [unreported]
    finally:
        await store.close()


async def test_the_file_stops_growing_when_sessions_leave_as_they_come(tmp_path: Path) -> None:
    path = tmp_path / "capture.sqlite"
    store = CaptureStore(path)
    await store.open()
    sessions = SessionRegistry(store)
    retention = Retention(store, sessions, RetentionPolicy(acknowledged_s=0))
    sizes = []
    try:
        for _ in range(6):
            for _ in range(20):
                await retention.reported(await _session_with_calls(store, sessions, 4), acknowledged=True)
            await retention.sweep()
            await store._run(lambda: store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            sizes.append(path.stat().st_size)
    finally:
        await store.close()
    assert sizes[-1] <= sizes[1] * 1.1, f"the file kept growing: {sizes}"
    assert sizes[-1] < 6 * 20 * 4 * len(BODY) / 3, "it holds far less than every call ever captured"


async def test_a_pruned_session_is_gone_from_the_registry_too(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "capture.sqlite")
    await store.open()
    sessions = SessionRegistry(store)
    retention = Retention(store, sessions, RetentionPolicy(acknowledged_s=0))
    try:
        session_id = await _session_with_calls(store, sessions, 1)
        assert (await sessions.find(session_id)).session.state == gateway_pb2.SESSION_STATE_CLOSED
        await retention.reported(session_id, acknowledged=True)
        await retention.sweep()
        assert retention.pruned == 1
        with pytest.raises(NotFoundError):
            await sessions.find(session_id)
    finally:
        await store.close()
