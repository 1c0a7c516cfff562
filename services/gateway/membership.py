"""Gateway node membership in etcd: one key per live node, bound to that node's lease.

A node registers `<prefix>nodes/<node_id>` with a small JSON `NodeRecord` (identity, addresses,
capacity, start time) bound to a lease it keeps alive (`lodestar.leased_key.LeasedKey`, as inference
replicas do). The key is the node's presence: revoked at shutdown (gone at once), expired by etcd a TTL
after the node dies or is cut off. When the lease is lost (partition, etcd restart, expiry) `Membership`
logs an error and registers again with a new lease as soon as etcd answers, retrying with bounded
exponential backoff; etcd being down at start only delays registration (proxying does not need etcd).
`list_nodes` is the reader side (rollout).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from lodestar import errors
from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.leased_key import RETRY_INITIAL_S, RETRY_MAX_S, LeasedKey
from lodestar.logging import get_logger

DEFAULT_PREFIX = "/lodestar/"
NODES_DIR = "nodes/"
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
    """Keeps one node registered for as long as it runs (see the module docstring): a `LeasedKey` whose
    value is the node's record.

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
        self.record = record
        self.key = node_key(record.node_id, prefix)
        self.ttl = ttl
        self._presence = LeasedKey(
            endpoint, self.key, record.to_json, what="node", ttl=ttl, tls=tls, retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
        )  # fmt: skip

    @property
    def endpoint(self) -> str:
        return self._presence.endpoint

    @property
    def is_registered(self) -> bool:
        return self._presence.is_registered

    @property
    def lease_id(self) -> int | None:
        """The lease the key is bound to while registered."""
        return self._presence.lease_id

    @property
    def registrations(self) -> int:
        """How many times the key was written (1 + re-registrations after a lost lease)."""
        return self._presence.registrations

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Block until the key is written; DeadlineExceededError after `timeout` seconds."""
        await self._presence.wait_registered(timeout)

    def start(self) -> None:
        self._presence.start()

    async def stop(self) -> None:
        """Leave: stop re-registering, revoke the lease (key deleted now), close the client."""
        await self._presence.stop()
