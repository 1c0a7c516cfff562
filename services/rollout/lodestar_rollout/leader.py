"""Leader election of rollout instances: one leads (opens the store and serves), the others wait.

Every instance campaigns on `<prefix>rollout/leader` with its address as the value, bound to its own
lease. The winner opens the store, reconciles with etcd and serves; a standby keeps campaigning (its
health says NOT_SERVING) and follows who leads, so it can redirect clients there. When the leader's
lease is lost (the process died, or etcd did not hear from it for a TTL) it steps down at once (stops
serving, closes the store) and campaigns again; a standby takes over within about a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from lodestar import errors
from lodestar.election import Election
from lodestar.etcd import EtcdClient, tls_from_settings
from lodestar.logging import get_logger
from lodestar_rollout.retention import Retention
from lodestar_rollout.service import RolloutCore
from lodestar_rollout.settings import RolloutSettings
from lodestar_rollout.stores import describe, open_store

RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
_log = get_logger("rollout.leader")


def leader_key(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/rollout/leader"


class LeaderRole:
    """Campaigns, runs a `RolloutCore` while leading, and knows the current leader's address."""

    def __init__(self, settings: RolloutSettings, on_serving: Callable[[bool], Awaitable[None]]) -> None:
        self._settings = settings
        self._etcd_tls = tls_from_settings(settings.etcd, settings)  # refuses plaintext beyond loopback
        self._on_serving = on_serving
        self.address = ""
        self.core: RolloutCore | None = None
        self.leader_address: str | None = None
        self.terms = 0

    async def run(self) -> None:
        """Campaign and lead, forever (cancel to stop); etcd outages are retried with backoff."""
        delay = RETRY_INITIAL_S
        while True:
            try:
                async with EtcdClient(self._settings.etcd, tls=self._etcd_tls) as etcd:
                    await etcd.ping()
                    delay = RETRY_INITIAL_S
                    await self._term(etcd)
            except errors.LodestarError as error:
                _log.warning("rollout leadership interrupted", error=error.message, retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _term(self, etcd: EtcdClient) -> None:
        election = Election(etcd, leader_key(self._settings.etcd_prefix))
        lease = await etcd.grant_lease(self._settings.leader_ttl_s)
        follower = asyncio.create_task(self._follow(election))
        try:
            leadership = await election.campaign(lease, self.address)
            await self._lead(etcd, leadership.wait_lost())
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            with contextlib.suppress(errors.LodestarError):
                await lease.revoke()

    async def _lead(self, etcd: EtcdClient, lost: Awaitable[str]) -> None:
        store = await asyncio.to_thread(open_store, self._settings.store, synchronous=self._settings.store_synchronous)
        keep = Retention(period_s=self._settings.retention_days * 86400.0, archive_dir=self._settings.archive_dir)
        core = RolloutCore(store, etcd, self._settings.etcd_prefix, keep=keep)
        await core.start()
        self.core, self.leader_address = core, self.address
        self.terms += 1
        _log.info("leading", address=self.address, store=describe(self._settings.store), term=self.terms)
        await self._on_serving(True)
        try:
            reason = await lost
            _log.error("rollout leadership lost, stepping down", reason=reason)
        finally:
            self.core = None
            await self._on_serving(False)
            await core.stop()

    async def _follow(self, election: Election) -> None:
        """Keep `leader_address` current while this instance is not the leader."""
        while True:
            try:
                async for leader in election.observe():
                    if self.core is None:
                        self.leader_address = None if leader is None else leader.text
            except errors.LodestarError as error:
                _log.debug("leader observation broken", error=error.message)
            await asyncio.sleep(RETRY_INITIAL_S)

    async def stop(self) -> None:
        """Stop leading (the store is closed; the lease is revoked by the cancelled campaign loop)."""
        core, self.core = self.core, None
        if core is not None:
            await core.stop()
