"""Off-loop, batched side effects of the rollout service: store writes and ownership-key deletes.

`StoreWriter` runs every store call on one dedicated thread. Writes are queued in order and each pass
commits everything queued since the previous one in a single transaction (group commit: under load one
commit carries many RPCs' changes); a read (`read`) waits until the writes queued before it landed.
`KeyReleaser` deletes the ownership keys of ended attempts once their write landed, batching every key
queued meanwhile into a few etcd transactions; a failure is logged and left to the next reconciliation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from lodestar import errors
from lodestar.logging import get_logger
from lodestar_rollout.leases import Ownership
from lodestar_rollout.store import Rows, Store

T = TypeVar("T")
_log = get_logger("rollout.writer")


class StoreWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rollout-store")
        self._queue: list[tuple[Rows, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._last: asyncio.Future[None] | None = None
        self.commits = 0

    def write(self, rows: Rows) -> asyncio.Future[None]:
        """Queue `rows`; the future resolves once they are committed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((rows, future))
        self._last = future
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="rollout-store-flush")
        return future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await loop.run_in_executor(self._executor, self.store.write, [rows for rows, _ in batch])
            except Exception as error:
                _log.error("store write failed", snapshots=len(batch), exc_info=error)
                for _, future in batch:
                    if not future.done():
                        future.set_exception(errors.UnavailableError("the rollout store could not be written"))
                continue
            self.commits += 1
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def read(self, function: Callable[..., T], *args: Any) -> T:
        """Run a store call on the store thread after every write queued so far landed."""
        if self._last is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._last)
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def close(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        await asyncio.get_running_loop().run_in_executor(self._executor, self.store.close)
        self._executor.shutdown(wait=True)


class KeyReleaser:
    def __init__(self, ownership: Ownership) -> None:
        self._ownership = ownership
        self._queue: list[tuple[asyncio.Future[None] | None, list[tuple[str, int]]]] = []
        self._task: asyncio.Task[None] | None = None

    def release(self, attempts: list[tuple[str, int]], after: asyncio.Future[None] | None = None) -> None:
        """Delete the keys of `attempts` (session id, attempt) once `after` (their write) resolved."""
        self._queue.append((after, attempts))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="rollout-release-keys")

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            waits = [after for after, _ in batch if after is not None]
            await asyncio.gather(*(asyncio.shield(w) for w in waits), return_exceptions=True)
            attempts = [attempt for _, chunk in batch for attempt in chunk]
            try:
                await self._ownership.release(attempts)
            except errors.LodestarError as error:  # the next reconciliation deletes them
                _log.warning("could not delete ownership keys", keys=len(attempts), error=error.message)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
