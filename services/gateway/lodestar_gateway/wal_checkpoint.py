"""The capture store's WAL policy: the WAL file stays bounded under continuous writes, and no commit ever runs a
checkpoint itself.

SQLite reuses a WAL from its start only when a checkpoint has copied every frame into the database before the
next write begins. A PASSIVE checkpoint on a second connection copies concurrently with new commits, so under a
steady stream of writes it never catches up and the WAL grows without end (and a WAL file never shrinks by
itself). `WalCheckpointer.checkpoint` therefore runs in two steps:

1. PASSIVE rounds on its own connection and thread, concurrent with commits: each round copies what the WAL
   held when it began, and the rounds repeat until what arrived during the last one is small (`tail_bytes`).
2. A RESTART checkpoint handed to the store's writer thread (`on_writer`), so it runs between two of its
   transactions: it copies that small tail and rewinds the WAL, and the next commit writes from its start.
   Calls arriving meanwhile wait for it like for any transaction and join the next group commit. When the
   tail is still large after the last round (`rewind_tail_bytes`: writes outpace the copy), the rewind is left
   to the next checkpoint rather than making the writer wait for all of it.

`journal_size_limit` (`limit_bytes`) then cuts the WAL file back after a rewind when something (an outside
reader holding an old snapshot: neither step can copy past it, nor rewind while it reads) let it grow past
the limit. The restart step never waits for such a reader (busy timeout 0): it is retried after the next
`checkpoint_bytes` of writes.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lodestar.logging import get_logger

_log = get_logger("gateway.capture")
T = TypeVar("T")
OnWriter = Callable[[Callable[[], T]], Awaitable[T]]
"""Runs a function on the store's writer thread, between its transactions."""


@dataclass(frozen=True)
class WalPolicy:
    checkpoint_bytes: int = 32 * 1024 * 1024
    """Start a checkpoint after about this much newly written data."""
    limit_bytes: int = 64 * 1024 * 1024
    """journal_size_limit: the WAL file is cut back to this size by the first commit after a rewind."""
    tail_bytes: int = 2 * 1024 * 1024
    """Copy passively until less than this arrived during the last round, then rewind on the writer thread."""
    passive_rounds: int = 6
    """Most PASSIVE rounds of one checkpoint."""
    rewind_tail_bytes: int = 8 * 1024 * 1024
    """After the last round, rewind only if less than this arrived during it (the writer waits while the rewind
    copies it); more: writes outpace the copy, the rewind waits for the next checkpoint."""


@dataclass(frozen=True)
class CheckpointResult:
    rounds: int
    """PASSIVE rounds run."""
    restarted: bool
    """Whether the WAL was rewound (False: a reader held a snapshot; retried at the next checkpoint)."""
    writer_s: float
    """Seconds the writer thread spent in the restart step (the commits it delayed)."""
    tail_bytes: int
    """What arrived during the last PASSIVE round (about what the rewind had to copy)."""


class WalCheckpointer:
    """Checkpoints one WAL-mode SQLite file from a second connection (see the module docstring)."""

    def __init__(self, path: Path, *, synchronous: str, policy: WalPolicy, page_size: int) -> None:
        self.path = path
        self.policy = policy
        self._synchronous = synchronous
        self._page_size = page_size
        self._db: sqlite3.Connection | None = None

    def configure(self, db: sqlite3.Connection) -> None:
        """Settings of the store's writer connection: no automatic checkpoint inside a commit, and the WAL's
        size limit after a rewind."""
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute(f"PRAGMA journal_size_limit={self.policy.limit_bytes}")

    def open(self) -> None:
        """Open the checkpoint connection (the database must exist, in WAL mode)."""
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA busy_timeout=0")  # never wait for a reader or a writer: retried later
        db.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        db.execute(f"PRAGMA journal_size_limit={self.policy.limit_bytes}")
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the WAL checkpointer is not open")
        return self._db

    def passive(self) -> tuple[int, int]:
        """One PASSIVE round: (frames the WAL held when it began, frames copied into the database so far)."""
        _, log, copied = self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(log), int(copied)

    def restart(self) -> tuple[bool, float]:
        """Copy the rest and rewind the WAL (call it on the writer thread): (rewound, seconds it took)."""
        started = time.perf_counter()
        busy, _, _ = self._conn().execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        return not busy, time.perf_counter() - started

    async def checkpoint(
        self, on_passive: OnWriter[tuple[int, int]], on_writer: OnWriter[tuple[bool, float]]
    ) -> CheckpointResult:
        """PASSIVE rounds through `on_passive` (a thread other than the writer's), then the rewind through
        `on_writer`."""
        rounds, previous, arrived = 0, -1, 0
        while rounds < self.policy.passive_rounds:
            log, _ = await on_passive(self.passive)
            rounds += 1
            arrived = (log - previous if 0 <= previous <= log else log) * self._page_size
            previous = log
            if rounds > 1 and arrived <= self.policy.tail_bytes:
                break
        restarted, writer_s = False, 0.0
        if arrived <= self.policy.rewind_tail_bytes:
            restarted, writer_s = await on_writer(self.restart)
        result = CheckpointResult(rounds=rounds, restarted=restarted, writer_s=writer_s, tail_bytes=arrived)
        _log.debug(
            "capture checkpoint",
            rounds=rounds,
            restarted=restarted,
            writer_ms=round(writer_s * 1e3, 2),
            tail_bytes=arrived,
        )
        return result
