"""Inference replicas in etcd: one key per live replica, bound to its lease, read by gateways and the trainer.

A replica started with `--etcd` registers `<prefix>inference/<replica_id>` with a small JSON `ReplicaRecord`
(id, the InferenceService address others dial, the policy version it serves, model name, start time) under
a lease it keeps alive, and rewrites the record (same lease) each time it publishes a policy version. The
key is its presence: revoked when it drains (gone at once, so gateways stop sending it sessions before its
in-flight calls end), expired by etcd a TTL after it dies. A lost lease is re-registered with backoff, as
gateway nodes do (both are a `lodestar.leased_key.LeasedKey`). The reader side is `ReplicaWatch`: it lists the prefix,
then watches it from the next revision, and hands every change to a callback as the full map of live
replicas; when the watch breaks (etcd down, history compacted) it keeps the last map and lists again.

This lives in the kernel because three services agree on it: inference writes the keys, the gateway
(`lodestar_gateway/replica_watch.py`) and the trainer (`lodestar_trainer/weights/replica_discovery.py`) read them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from lodestar import errors
from lodestar.etcd import EtcdClient, EtcdTls, EventKind
from lodestar.leased_key import RETRY_INITIAL_S, RETRY_MAX_S, LeasedKey
from lodestar.logging import get_logger
from lodestar.presence import DEFAULT_PREFIX, Directory, JsonRecord, decoded

INFERENCE_DIR = "inference"
_log = get_logger("inference_registry")


@dataclass(frozen=True)
class ReplicaRecord(JsonRecord):
    """What a replica announces about itself (the value of its key, as JSON)."""

    kind = "replica"

    replica_id: str
    address: str
    """Where its InferenceService is dialled (host:port)."""
    policy_version: int
    """The policy version it serves now."""
    model_name: str
    started_at: datetime


@dataclass(frozen=True)
class RegisteredReplica:
    """A replica key as read from etcd: the record and the lease it is bound to (a new lease under the same
    key is a new process: it restarted)."""

    key: str
    record: ReplicaRecord
    lease_id: int


REPLICAS = Directory(INFERENCE_DIR, "replica", ReplicaRecord)
replicas_prefix = REPLICAS.prefix
replica_key = REPLICAS.key


async def list_replicas(client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> tuple[dict[str, RegisteredReplica], int]:
    """The replicas registered now by key, and the revision they were read at; bad values are skipped."""
    found, revision = await REPLICAS.read(client, prefix)
    return {item.key: RegisteredReplica(item.key, record, item.lease_id) for item, record in found}, revision


def _parse(key: str, value: bytes, lease_id: int) -> RegisteredReplica | None:
    record = decoded(ReplicaRecord, key, value)
    return RegisteredReplica(key, record, lease_id) if record is not None else None


class ReplicaRegistration(LeasedKey):
    """Keeps one replica's key in etcd while it serves (see the module docstring): a `LeasedKey` whose value
    is the record. `start()` never waits for etcd; `wait_registered()` does; `publish(version)` rewrites the
    record; `stop()` revokes the lease."""

    def __init__(
        self,
        endpoint: str,
        record: ReplicaRecord,
        *,
        ttl: int = 10,
        prefix: str = DEFAULT_PREFIX,
        tls: EtcdTls | None = None,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.record = record
        super().__init__(
            endpoint,
            replica_key(record.replica_id, prefix),
            lambda: self.record.to_json(),
            what="inference replica",
            ttl=ttl,
            tls=tls,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
        )

    def publish(self, policy_version: int) -> None:
        """The replica now serves `policy_version`: rewrite its record (in the background, same lease)."""
        if policy_version != self.record.policy_version:
            self.record = replace(self.record, policy_version=policy_version)
            self.changed()


OnChange = Callable[[Mapping[str, RegisteredReplica]], Awaitable[None]]


class ReplicaWatch:
    """The live replicas under a prefix, kept current by an etcd watch; `on_change` gets the whole map after
    the first listing and after every change (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        on_change: OnChange,
        *,
        prefix: str = DEFAULT_PREFIX,
        tls: EtcdTls | None = None,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._client = EtcdClient(endpoint, tls=tls)
        self._prefix = prefix
        self._on_change = on_change
        self._retry = (retry_initial_s, retry_max_s)
        self.replicas: dict[str, RegisteredReplica] = {}
        self._listed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait_listed(self, timeout: float | None = None) -> None:
        """Block until the first listing was handed to `on_change`; DeadlineExceededError after `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await self._listed.wait()
        except TimeoutError as error:
            raise errors.DeadlineExceededError(f"inference replicas not listed from etcd within {timeout} s") from error

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="inference-replica-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(errors.LodestarError):
            await self._client.close()

    async def _changed(self, replicas: dict[str, RegisteredReplica]) -> None:
        self.replicas = replicas
        await self._on_change(dict(replicas))

    async def _run(self) -> None:
        initial, limit = self._retry
        delay = initial
        connected = False
        while True:
            try:
                if not connected:
                    await self._client.__aenter__()
                    connected = True
                replicas, revision = await list_replicas(self._client, self._prefix)
                await self._changed(replicas)
                self._listed.set()
                delay = initial
                async with await self._client.watch_prefix(
                    replicas_prefix(self._prefix), start_revision=revision + 1
                ) as watch:
                    async for event in watch:
                        current = dict(self.replicas)
                        if event.kind is EventKind.DELETE:
                            current.pop(event.key, None)
                        elif (parsed := _parse(event.key, event.value, event.lease_id)) is not None:
                            current[event.key] = parsed
                        await self._changed(current)
                await asyncio.sleep(initial)  # etcd ended the watch (no error): list again, not in a tight loop
            except errors.LodestarError as error:  # keep the last map; list again once etcd answers
                _log.warning(
                    "inference replica watch interrupted; listing again", error=error.message, retry_in_s=delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)
