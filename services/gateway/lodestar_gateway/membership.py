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

from dataclasses import dataclass
from datetime import datetime

from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.leased_key import RETRY_INITIAL_S, RETRY_MAX_S, LeasedKey
from lodestar.presence import DEFAULT_PREFIX, Directory, JsonRecord

NODES_DIR = "nodes"


@dataclass(frozen=True)
class NodeRecord(JsonRecord):
    """What a node announces about itself (the value of its key, as JSON)."""

    kind = "node"

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


@dataclass(frozen=True)
class RegisteredNode:
    """A node key as read from etcd: the record plus the lease it is bound to (session ownership keys
    can be bound to the same lease, so they vanish with the node)."""

    key: str
    record: NodeRecord
    lease_id: int
    mod_revision: int


NODES = Directory(NODES_DIR, "node", NodeRecord)
nodes_prefix = NODES.prefix
node_key = NODES.key


async def list_nodes(client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> list[RegisteredNode]:
    """The nodes registered right now, sorted by key; values that do not parse are skipped (logged)."""
    found, _ = await NODES.read(client, prefix)
    return [RegisteredNode(item.key, record, item.lease_id, item.mod_revision) for item, record in found]


class Membership(LeasedKey):
    """Keeps one node registered for as long as it runs (see the module docstring): a `LeasedKey` whose
    value is the node's record. `start()` never waits for etcd; `wait_registered()` does. `stop()` revokes
    the lease (the key is deleted at once) and closes the client."""

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
        super().__init__(
            endpoint,
            node_key(record.node_id, prefix),
            record.to_json,
            what="node",
            ttl=ttl,
            tls=tls,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
        )
