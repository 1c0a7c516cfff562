"""Gateway node membership in etcd: one key per live node, bound to that node's lease.

A node registers `<prefix>nodes/<node_id>` with a small JSON `NodeRecord` (identity, addresses,
capacity, start time) bound to a lease it keeps alive. The key is the node's presence: revoked at
shutdown (gone at once), expired by etcd a TTL after the node dies or is cut off. When the lease is
lost (partition, etcd restart, expiry) `Membership` logs an error and registers again with a new lease
as soon as etcd answers, retrying with bounded exponential backoff; etcd being down at start only
delays registration (proxying does not need etcd). `list_nodes` is the reader side (rollout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from lodestar import errors
from lodestar.etcd import DEFAULT_TIMEOUT_S, EtcdClient, EtcdTls, Lease
from lodestar.logging import get_logger

DEFAULT_PREFIX = "/lodestar/"
NODES_DIR = "nodes/"
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
_log = get_logger("gateway.membership")


def nodes_prefix(prefix: str = DEFAULT_PREFIX) -> str:
    """Where node keys live: `<prefix>nodes/`."""
    return f"{prefix.rstrip('/')}/{NODES_DIR}"


def node_key(node_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    if not node_id or "/" in node_id:
        raise errors.InvalidArgumentError(f"node id must be non-empty and without '/', got {node_id!r}")
    return nodes_prefix(prefix) + node_id


@dataclass(frozen=True)
class NodeRecord:
    """What a node announces about itself (the value of its key, as JSON)."""

    node_id: str
    grpc_address: str
    """GatewayService address (host:port)."""
    http_base_url: str
    """Vendor-API base URL (http://host:port)."""
    inference: str
    """The InferenceService address this node sends model calls to."""
    capacity: int
    """Sessions this node can run at once (0 until the node lifecycle runs harnesses)."""
    started_at: datetime
    """When the node started serving (UTC)."""

    def to_json(self) -> str:
        fields: dict[str, Any] = asdict(self)
        fields["started_at"] = self.started_at.astimezone(UTC).isoformat()
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> NodeRecord:
        """Parse a node value; InvalidArgumentError when it is not a node record."""
        try:
            data = json.loads(raw)
            return cls(
                node_id=str(data["node_id"]),
                grpc_address=str(data["grpc_address"]),
                http_base_url=str(data["http_base_url"]),
                inference=str(data["inference"]),
                capacity=int(data["capacity"]),
                started_at=datetime.fromisoformat(str(data["started_at"])),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise errors.InvalidArgumentError(f"not a node record: {type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class RegisteredNode:
    """A node key as read from etcd: the record plus the lease it is bound to (session ownership keys
    can be bound to the same lease, so they vanish with the node)."""

    key: str
    record: NodeRecord
    lease_id: int
    mod_revision: int


async def list_nodes(client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> list[RegisteredNode]:
    """The nodes registered right now, sorted by key; values that do not parse are skipped (logged)."""
    snapshot = await client.get_prefix(nodes_prefix(prefix))
    nodes: list[RegisteredNode] = []
    for item in snapshot.items:
        try:
            record = NodeRecord.from_json(item.value)
        except errors.InvalidArgumentError as error:
            _log.warning("skipping malformed node key", key=item.key, error=error.message)
            continue
        nodes.append(RegisteredNode(item.key, record, item.lease_id, item.mod_revision))
    return nodes


class Membership:
    """Keeps one node registered for as long as it runs (see the module docstring).

    `start()` never waits for etcd; `wait_registered()` does. `stop()` revokes the lease (the key is
    deleted at once) and closes the client."""

    def __init__(
        self,
        endpoint: str,
        record: NodeRecord,
        *,
        ttl: int = 10,
        prefix: str = DEFAULT_PREFIX,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
        tls: EtcdTls | None = None,
    ) -> None:
        if ttl < 1:
            raise errors.InvalidArgumentError(f"etcd lease ttl must be at least 1 s, got {ttl}")
        self.record = record
        self.key = node_key(record.node_id, prefix)
        self.ttl = ttl
        self._retry = (retry_initial_s, retry_max_s)
        # Answer within the TTL, or a keepalive round trip could outlive the lease it refreshes.
        self._client = EtcdClient(endpoint, timeout=min(DEFAULT_TIMEOUT_S, float(ttl)), tls=tls)
        self._connected = False
        self._lease: Lease | None = None
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.registrations = 0
        """How many times the key was written (1 + re-registrations after a lost lease)."""

    @property
    def endpoint(self) -> str:
        return self._client.endpoint

    @property
    def is_registered(self) -> bool:
        return self._registered.is_set()

    @property
    def lease_id(self) -> int | None:
        """The lease the key is bound to while registered."""
        return self._lease.id if self.is_registered and self._lease is not None else None

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Block until the key is written; DeadlineExceededError after `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._registered.wait()
        except TimeoutError as error:
            raise errors.DeadlineExceededError(f"{self.key} not registered in etcd within {timeout} s") from error

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"membership-{self.record.node_id}")

    async def stop(self) -> None:
        """Leave: stop re-registering, revoke the lease (key deleted now), close the client."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._registered.clear()
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                await lease.revoke()
                _log.info("node left etcd", key=self.key, lease=f"{lease.id:x}")
            except errors.LodestarError as error:
                _log.warning("lease revoke failed; the node key expires after its TTL", key=self.key,
                             ttl=lease.ttl, error=error.message)  # fmt: skip
        with contextlib.suppress(errors.LodestarError):
            await self._client.close()

    async def _register(self) -> Lease:
        if not self._connected:
            await self._client.__aenter__()
            self._connected = True
        lease = self._lease = await self._client.grant_lease(self.ttl)
        try:
            await self._client.put(self.key, self.record.to_json(), lease=lease)
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
                    _log.warning("etcd unreachable: node serves but is not registered; retrying in the background",
                                 etcd=self.endpoint, key=self.key, error=error.message)  # fmt: skip
                else:
                    _log.debug("etcd registration retry failed", attempt=failures, error=error.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)
                continue
            self.registrations += 1
            self._registered.set()
            _log.info("node registered in etcd", key=self.key, lease=f"{lease.id:x}", ttl=lease.ttl,
                      failed_attempts=failures)  # fmt: skip
            delay, failures = initial, 0
            reason = await lease.wait_lost()
            self._registered.clear()
            _log.error("node membership lost: re-registering with a new lease", key=self.key,
                       lease=f"{lease.id:x}", reason=reason)  # fmt: skip
