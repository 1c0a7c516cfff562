"""One etcd key that says "this process is alive": written under a lease the process keeps alive.

Gateway nodes (`lodestar_gateway/membership.py`) and inference replicas (`lodestar/inference_registry.py`)
announce themselves this way. The key is revoked when the process leaves (gone at once) and expired by etcd a
TTL after it dies or is cut off. When the lease is lost (partition, etcd restart, expiry) the key is written
again under a new lease as soon as etcd answers, with bounded exponential backoff; etcd being down at start
only delays the first write. `changed()` rewrites the value (same lease), e.g. a replica's new policy version.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from lodestar import errors
from lodestar.etcd import DEFAULT_TIMEOUT_S, EtcdClient, EtcdTls, Lease
from lodestar.logging import get_logger

RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
_log = get_logger("etcd.presence")


class LeasedKey:
    """Keeps `key` = `value()` in etcd under a kept-alive lease while the process runs (see the module
    docstring). `start()` never waits for etcd; `wait_registered()` does; `stop()` revokes the lease. `what`
    names the process in log lines ("node", "inference replica")."""

    def __init__(
        self,
        endpoint: str,
        key: str,
        value: Callable[[], str],
        *,
        what: str,
        ttl: int = 10,
        tls: EtcdTls | None = None,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        if ttl < 1:
            raise errors.InvalidArgumentError(f"etcd lease ttl must be at least 1 s, got {ttl}")
        self.key = key
        self.ttl = ttl
        self._value = value
        self._what = what
        self._retry = (retry_initial_s, retry_max_s)
        # Answer within the TTL, or a keepalive round trip could outlive the lease it refreshes.
        self._client = EtcdClient(endpoint, timeout=min(DEFAULT_TIMEOUT_S, float(ttl)), tls=tls)
        self._connected = False
        self.lease: Lease | None = None
        self._registered = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._leaving: asyncio.Future[None] | None = None
        self.registrations = 0
        """How many times the key was registered (1 + re-registrations after a lost lease)."""

    @property
    def endpoint(self) -> str:
        return self._client.endpoint

    @property
    def is_registered(self) -> bool:
        return self._registered.is_set()

    @property
    def lease_id(self) -> int | None:
        """The lease the key is bound to while registered."""
        return self.lease.id if self.is_registered and self.lease is not None else None

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Block until the key is written; DeadlineExceededError after `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._registered.wait()
        except TimeoutError as error:
            raise errors.DeadlineExceededError(f"{self.key} not registered in etcd within {timeout} s") from error

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leased-key-{self.key}")

    def changed(self) -> None:
        """`value()` changed: write it again (in the background, under the same lease)."""
        self._changed.set()

    async def stop(self) -> None:
        """Leave: stop re-registering, revoke the lease (key deleted now), close the client. Calls that overlap
        (a server's drain and its shutdown) share one leave, and each returns only once it is done."""
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._leave())
        await asyncio.shield(self._leaving)

    async def _leave(self) -> None:
        lease = await self._halt()
        if lease is not None:
            try:
                await lease.revoke()
                _log.info(f"{self._what} left etcd", key=self.key, lease=f"{lease.id:x}")
            except errors.LodestarError as error:
                _log.warning(
                    "lease revoke failed; the key expires after its TTL",
                    key=self.key,
                    ttl=lease.ttl,
                    error=error.message,
                )
        with contextlib.suppress(errors.LodestarError):
            await self._client.close()

    async def abandon(self) -> None:
        """Stop keeping the key without revoking it: it expires a TTL later, as when the process is killed."""
        lease = await self._halt()
        if lease is not None:
            await lease.stop_keepalive("abandoned")

    async def _halt(self) -> Lease | None:
        """Stop the keeping task and hand over the lease it held (None when there was none)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._registered.clear()
        lease, self.lease = self.lease, None
        return lease

    async def _write(self, lease: Lease) -> None:
        self._changed.clear()
        await self._client.put(self.key, self._value(), lease=lease)

    async def _register(self) -> Lease:
        if not self._connected:
            await self._client.__aenter__()
            self._connected = True
        lease = self.lease = await self._client.grant_lease(self.ttl)
        try:
            await self._write(lease)
        except errors.LodestarError:
            await lease.stop_keepalive("registration failed")  # never written: let it expire
            raise
        return lease

    async def _run(self) -> None:
        initial, limit = self._retry
        delay, failures = initial, 0
        while True:
            try:
                lease = await self._register()
            except errors.LodestarError as error:
                failures += 1
                if failures == 1:
                    _log.warning(
                        f"etcd unreachable: {self._what} serves but is not registered; retrying in the background",
                        etcd=self.endpoint,
                        key=self.key,
                        error=error.message,
                    )
                else:
                    _log.debug("etcd registration retry failed", attempt=failures, error=error.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)
                continue
            self.registrations += 1
            self._registered.set()
            _log.info(
                f"{self._what} registered in etcd",
                key=self.key,
                lease=f"{lease.id:x}",
                ttl=lease.ttl,
                failed_attempts=failures,
            )
            delay, failures = initial, 0
            reason = await self._keep(lease)
            self._registered.clear()
            _log.error(
                f"{self._what} registration lost: re-registering with a new lease",
                key=self.key,
                lease=f"{lease.id:x}",
                reason=reason,
            )

    async def _keep(self, lease: Lease) -> str:
        """Rewrite the value on every change until the lease is lost; returns why it was."""
        lost = asyncio.ensure_future(lease.wait_lost())
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            while True:
                await asyncio.wait({lost, changed}, return_when=asyncio.FIRST_COMPLETED)
                if lost.done():
                    return lost.result()
                try:
                    await self._write(lease)
                except errors.LodestarError as error:  # try again shortly (or re-register if the lease goes)
                    _log.warning("could not rewrite the key", key=self.key, error=error.message)
                    await asyncio.sleep(self._retry[0])
                    self._changed.set()
                changed = asyncio.ensure_future(self._changed.wait())
        finally:
            lost.cancel()
            changed.cancel()
