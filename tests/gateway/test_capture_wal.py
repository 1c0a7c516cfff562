"""The capture store's WAL stays bounded under continuous writes (lodestar_gateway/wal_checkpoint.py), on a real
SQLite file: writers never pause long enough for a PASSIVE checkpoint alone to catch up, and an outside reader
holds an old snapshot for a while (no checkpoint can rewind the WAL meanwhile); once it lets go, the WAL file
is back under its limit, and every record written is there. Plus the rule that decides when the writer thread
rewinds (pure logic)."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lodestar.v1 import common_pb2
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.wal_checkpoint import WalCheckpointer, WalPolicy

POLICY = WalPolicy(checkpoint_bytes=512 * 1024, limit_bytes=4 * 1024 * 1024, tail_bytes=128 * 1024)
BODY = "y" * 32_000
"""A request half of a small agent call."""
WRITERS = 4
WRITE_S = 1.5
READER_HOLDS = (0.2, 0.6)
"""When (seconds after the writes start) the outside reader takes its snapshot and lets it go."""


def _wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _write_calls(store: CaptureStore, writer: int, until: float) -> int:
    """One session's calls back to back until `until` (monotonic); how many were written."""
    session_id, sequence = f"ses_{writer}_{secrets.token_hex(4)}", 0
    while time.monotonic() < until:
        call_id = secrets.token_hex(8)
        await store.begin(call_id, lambda: common_pb2.CallRecord(original_request_json=BODY))
        await store.append(call_id, common_pb2.CallRecord(session_id=session_id, sequence=sequence))
        sequence += 1
        await asyncio.sleep(0.01)
    return sequence


async def _hold_snapshot(path: Path, start: float, hold: tuple[float, float]) -> int:
    """An outside reader (another connection, as an export or a debugging shell would be) holding a read
    transaction from `start + hold[0]` to `start + hold[1]`; the WAL size when it lets go."""
    await asyncio.sleep(start + hold[0] - time.monotonic())
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM calls").fetchone()
        await asyncio.sleep(start + hold[1] - time.monotonic())
        return _wal_bytes(path)
    finally:
        reader.execute("COMMIT")
        reader.close()


async def test_the_wal_stays_under_its_limit_under_continuous_writes_and_a_long_reader(tmp_path: Path) -> None:
    path = tmp_path / "capture.sqlite"
    store = CaptureStore(path, wal=POLICY)
    await store.open()
    try:
        start = time.monotonic()
        until = start + WRITE_S
        tail: list[int] = []

        async def sample_tail() -> None:  # the WAL's size over the last quarter of the writes
            await asyncio.sleep(WRITE_S * 0.75)
            while time.monotonic() < until:
                tail.append(_wal_bytes(path))
                await asyncio.sleep(0.02)

        writes = [_write_calls(store, writer, until) for writer in range(WRITERS)]
        reader = asyncio.create_task(_hold_snapshot(path, start, READER_HOLDS))
        sampler = asyncio.create_task(sample_tail())
        written = await asyncio.gather(*writes)
        held_at = await reader
        await sampler
        wal_after = _wal_bytes(path)
        assert await store.stored() == (0, sum(written)), "every record written is in the store"
    finally:
        await store.close()
    assert sum(written) * len(BODY) > 2 * POLICY.limit_bytes, "enough was written to pass the limit twice over"
    assert held_at > POLICY.limit_bytes, f"the reader's snapshot let the WAL grow ({held_at} bytes)"
    assert any(not c.restarted for c in store.checkpoints), "a rewind waited for the reader"
    assert store.checkpoints[-1].restarted
    assert max(tail) <= POLICY.limit_bytes, f"the WAL stays under its limit after the reader left: {tail}"
    assert wal_after <= POLICY.limit_bytes


async def test_the_rewind_waits_for_the_next_checkpoint_when_writes_outpace_the_copy(tmp_path: Path) -> None:
    """Pure logic of the rounds: a WAL that keeps growing by more than `rewind_tail_bytes` per round is not
    rewound (that would make the writer copy all of it); one whose last round saw little arrive is."""
    policy = WalPolicy(tail_bytes=4 * 16384, rewind_tail_bytes=16 * 16384, passive_rounds=3)
    checkpointer = WalCheckpointer(tmp_path / "x.sqlite", synchronous="normal", policy=policy, page_size=16384)
    rewinds: list[str] = []

    async def on_writer(fn: Callable[[], tuple[bool, float]]) -> tuple[bool, float]:
        rewinds.append("rewind")
        return True, 0.001

    def passive_returning(logs: list[int]) -> Callable[[Callable[[], tuple[int, int]]], Awaitable[tuple[int, int]]]:
        async def on_passive(fn: Callable[[], tuple[int, int]]) -> tuple[int, int]:
            log = logs.pop(0)
            return log, log

        return on_passive

    outpaced = await checkpointer.checkpoint(passive_returning([100, 200, 300]), on_writer)
    assert (outpaced.rounds, outpaced.restarted, rewinds) == (3, False, [])
    caught_up = await checkpointer.checkpoint(passive_returning([100, 150, 152]), on_writer)
    assert (caught_up.rounds, caught_up.restarted, caught_up.tail_bytes, rewinds) == (3, True, 2 * 16384, ["rewind"])
    early = await checkpointer.checkpoint(passive_returning([100, 101]), on_writer)
    assert (early.rounds, early.restarted) == (2, True)
