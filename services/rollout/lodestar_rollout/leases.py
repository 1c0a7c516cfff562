"""Session ownership in etcd: one key per running attempt, bound to the lease of the node that runs it.

`<prefix>rollout/owners/<node_id>/<session_id>/<attempt>` -> `{"node_id": ..., "attempt": N}`, written when
the attempt is handed out with the node's own lease id (so the key dies with the node) and deleted by
rollout when the attempt ends. One key per attempt makes deletes unambiguous: a late delete of attempt
1 can never remove attempt 2's key. The node id leads the key so that etcd's roles can give each node its
own keys (`lodestar.etcd_roles`): etcd lets a node revoke its lease only if it may write every key on it.

`OwnershipWatch.run()` keeps a watch on the prefix: on every (re)connection it first calls `reconcile`
(which lists the keys, requeues running attempts without one, and returns the revision it read at), then
watches from the next revision and reports each deleted key to `on_deleted` (a node's lease expired or
was revoked). When etcd goes away it retries with exponential backoff and reconciles again, so nothing
deleted meanwhile is missed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from lodestar import errors
from lodestar.etcd import EtcdClient, EventKind
from lodestar.logging import get_logger

MAX_OPS_PER_TXN = 128
"""etcd's default --max-txn-ops."""
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
_log = get_logger("rollout.leases")

Owners = dict[tuple[str, int], str]
"""(session id, attempt) -> node id of every ownership key."""


def owners_prefix(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/rollout/owners/"


class Ownership:
    """Writes and deletes ownership keys under `owners_prefix(prefix)`."""

    def __init__(self, etcd: EtcdClient, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = owners_prefix(prefix)
        self._nodes: Owners = {}
        """The node of each key written or read here (a release names only the session and attempt)."""

    def key(self, node_id: str, session_id: str, attempt: int) -> str:
        return f"{self.prefix}{node_id}/{session_id}/{attempt}"

    def _parse(self, key: str) -> tuple[str, str, int] | None:
        node_id, _, rest = key.removeprefix(self.prefix).partition("/")
        session_id, _, attempt = rest.rpartition("/")
        return (node_id, session_id, int(attempt)) if node_id and session_id and attempt.isdigit() else None

    def parse(self, key: str) -> tuple[str, int] | None:
        """(session id, attempt) of an ownership key, None for another key."""
        parsed = self._parse(key)
        return None if parsed is None else parsed[1:]

    async def claim(self, owners: list[tuple[str, str, int]], lease_id: int) -> None:
        """Write the keys of (session id, node id, attempt) bound to the node's lease.

        FailedPreconditionError when etcd does not know the lease (expired: the node must register
        again); UnavailableError when etcd does not answer.
        """
        items: list[tuple[str, bytes | str]] = [
            (self.key(node, sid, attempt), json.dumps({"node_id": node, "attempt": attempt}))
            for sid, node, attempt in owners
        ]
        try:
            for start in range(0, len(items), MAX_OPS_PER_TXN):
                await self.etcd.put_many(items[start : start + MAX_OPS_PER_TXN], lease_id=lease_id)
        except errors.NotFoundError as error:
            raise errors.FailedPreconditionError(
                f"lease {lease_id:x} is unknown to etcd (expired?): register the node again"
            ) from error
        self._nodes.update({(sid, attempt): node for sid, node, attempt in owners})

    async def release(self, attempts: list[tuple[str, int]]) -> None:
        """Delete the keys of ended attempts (session id, attempt)."""
        if any(attempt not in self._nodes for attempt in attempts):  # written by an earlier leader
            await self.snapshot()
        keys = [self.key(self._nodes[item], *item) for item in attempts if item in self._nodes]
        for item in attempts:
            self._nodes.pop(item, None)
        for start in range(0, len(keys), MAX_OPS_PER_TXN):
            await self.etcd.delete_many(keys[start : start + MAX_OPS_PER_TXN])

    async def snapshot(self) -> tuple[Owners, int]:
        """Every ownership key now, and the revision it was read at."""
        snapshot = await self.etcd.get_prefix(self.prefix)
        owners: Owners = {}
        for item in snapshot.items:
            parsed = self._parse(item.key)
            if parsed is not None:
                node_id, session_id, attempt = parsed
                owners[(session_id, attempt)] = node_id
        self._nodes = dict(owners)
        return owners, snapshot.revision


class OwnershipWatch:
    """Reconcile, then follow deletions of ownership keys, across etcd outages (see module docstring)."""

    def __init__(
        self,
        ownership: Ownership,
        reconcile: Callable[[], Awaitable[int]],
        on_deleted: Callable[[str, int], Awaitable[None]],
        *,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._ownership = ownership
        self._reconcile = reconcile
        self._on_deleted = on_deleted
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self.watching = asyncio.Event()
        """Set while the watch is established (after a reconciliation)."""
        self.reconciliations = 0

    async def run(self) -> None:
        delay = self._retry_initial_s
        while True:
            try:
                await self._follow()
            except errors.LodestarError as error:
                _log.warning("ownership watch broken, retrying", error=error.message, retry_in_s=round(delay, 2))
            if self.watching.is_set():  # it worked for a while: start the backoff over
                self.watching.clear()
                delay = self._retry_initial_s
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max_s)

    async def _follow(self) -> None:
        revision = await self._reconcile()
        self.reconciliations += 1
        etcd = self._ownership.etcd
        # Deletions only: every hand-out PUTs a key, and those events (half of all) were decoded on the event
        # loop only to be skipped.
        watching = etcd.watch_prefix(self._ownership.prefix, start_revision=revision + 1, deletes_only=True)
        async with await watching as watch:
            self.watching.set()
            _log.info("ownership watch established", revision=revision)
            async for event in watch:
                if event.kind is not EventKind.DELETE:
                    continue
                parsed = self._ownership.parse(event.key)
                if parsed is not None:
                    await self._on_deleted(*parsed)
