"""Leader election on etcd (the rollout service runs one leader at a time).

The leader is whoever created the election key, bound to its own lease: when the leader's lease ends
(the process died, or its keepalive failed for a whole TTL) etcd deletes the key and the next
campaigner takes over. Built on the public API of `lodestar.etcd`; it does not import the etcd client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from lodestar import errors
from lodestar.etcd import EtcdClient, EventKind, KeyValue, Lease
from lodestar.logging import get_logger

_log = get_logger("election")


class Leadership:
    """Held leadership: the election key, bound to the leader's lease. It ends when the lease is lost
    (`wait_lost()`) or on `resign()`; a leader must stop acting as one as soon as either happens."""

    def __init__(self, client: EtcdClient, key: str, value: bytes, create_revision: int, lease: Lease) -> None:
        self._client = client
        self.key = key
        self.value = value
        self.create_revision = create_revision
        self.lease = lease

    async def wait_lost(self) -> str:
        return await self.lease.wait_lost()

    async def resign(self) -> None:
        """Give up leadership (delete the key if it is still ours); the lease stays alive."""
        await self._client.compare_and_delete(self.key, expected_mod_revision=self.create_revision)


class Election:
    """Leader election on one key: the leader is whoever created it, bound to their lease.

    `campaign` creates the key if absent; otherwise it watches for its deletion (the leader resigned
    or its lease ended) from the revision it saw, so no hand-over is missed, and tries again.
    """

    def __init__(self, client: EtcdClient, key: str) -> None:
        self._client = client
        self.key = key

    async def leader(self) -> KeyValue | None:
        """The current leader's key (its value names the leader), or None."""
        return await self._client.get(self.key)

    async def observe(self) -> AsyncIterator[KeyValue | None]:
        """The current leader, then every change (None while there is none), until the caller stops."""
        snapshot = await self._client.get_key(self.key)
        yield snapshot.items[0] if snapshot.items else None
        async with await self._client.watch(self.key, start_revision=snapshot.revision + 1) as watch:
            async for event in watch:
                if event.kind is EventKind.DELETE:
                    yield None
                else:
                    yield KeyValue(
                        self.key, event.value, event.version, event.create_revision, event.revision, event.lease_id
                    )

    async def campaign(self, lease: Lease, value: bytes | str, *, timeout: float | None = None) -> Leadership:
        """Block until this caller leads; FailedPreconditionError if `lease` is lost first,
        DeadlineExceededError after `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self._campaign(lease, value.encode() if isinstance(value, str) else value)
        except TimeoutError as error:
            raise errors.DeadlineExceededError(f"campaign for {self.key} timed out after {timeout} s") from error

    async def _campaign(self, lease: Lease, value: bytes) -> Leadership:
        while True:
            if lease.is_lost:
                raise errors.FailedPreconditionError(f"lease for {self.key} lost: {lease.lost_reason}")
            result = await self._client.create_if_absent(self.key, value, lease=lease)
            if result.succeeded:
                _log.info("elected", key=self.key, revision=result.revision)
                return Leadership(self._client, self.key, value, result.revision, lease)
            current = result.current
            if current is not None and current.lease_id == lease.id:  # ours already (a retried create)
                return Leadership(self._client, self.key, current.value, current.create_revision, lease)
            await self._wait_deleted(result.revision + 1, lease)

    async def _wait_deleted(self, start_revision: int, lease: Lease) -> None:
        async with await self._client.watch(self.key, start_revision=start_revision) as watch:

            async def deleted() -> None:
                async for event in watch:
                    if event.kind is EventKind.DELETE:
                        return

            waiters = [asyncio.ensure_future(deleted()), asyncio.ensure_future(lease.wait_lost())]
            try:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
            for waiter in done:
                waiter.result()  # re-raise a broken watch
