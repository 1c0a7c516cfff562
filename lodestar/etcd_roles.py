"""Who may read and write which of lodestar's etcd keys: one etcd role per key kind and per writer, so an
escaped gateway node cannot forge an inference replica, another node or the rollout leader
(docs/security.md, "Credentials per role").

The keys under the prefix (default `/lodestar/`) and their writers:

    nodes/<node_id>                               a gateway node's presence (its lease)   the node
    inference/<replica_id>                        an inference replica's registration     the replica
    rollout/leader                                the elected rollout leader              rollout
    rollout/owners/<node_id>/<session>/<attempt>  a running attempt, on its node's lease  rollout

Users are certificate CNs (etcd's --client-cert-auth): `lodestar-rollout`, `lodestar-trainer` (reads the
replicas), and per node `lodestar-node-<id>` (writes only `nodes/<id>` and `rollout/owners/<id>/`, reads the
replicas) and per replica `lodestar-inference-<id>` (writes only `inference/<id>`). Where several nodes or
replicas share one certificate (a Kubernetes Deployment), the kind users `lodestar-gateway` (every node's
keys) and `lodestar-inference` (every replica's) write their own kind and nothing else. etcd lets a key join
a lease, and a lease be revoked, only by a user who may write every key on it: so a node may write its
ownership keys (rollout puts them on the node's lease; the node revokes it when it leaves), and rollout may
write node keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from lodestar.errors import InvalidArgumentError
from lodestar.presence import directory, member_key


@dataclass(frozen=True)
class KeyGrant:
    """Permission on one key, or on every key under it when `prefix`."""

    key: str
    prefix: bool
    write: bool


@dataclass(frozen=True)
class EtcdRole:
    """An etcd role and the keys it grants; `users` are the CNs that get it."""

    name: str
    grants: tuple[KeyGrant, ...]
    users: tuple[str, ...]


def _read(key: str) -> KeyGrant:
    return KeyGrant(key, prefix=True, write=False)


def _own_kind(key: str) -> KeyGrant:
    return KeyGrant(key, prefix=True, write=True)


def _own_key(key: str) -> KeyGrant:
    return KeyGrant(key, prefix=False, write=True)


def _check_id(member_id: str, what: str) -> str:
    if not member_id or any(char in member_id for char in "/ \t\n"):
        raise InvalidArgumentError(f"{what} id must be non-empty, without '/' or spaces, got {member_id!r}")
    return member_id


def deployment_roles(prefix: str, *, nodes: list[str] = [], replicas: list[str] = []) -> list[EtcdRole]:  # noqa: B006
    """The roles of a deployment under `prefix`: rollout, the trainer, the shared gateway and inference
    kinds, and one role per named node and replica (for nodes and replicas with certificates of their own)."""
    nodes_dir, replicas_dir = directory(prefix, "nodes"), directory(prefix, "inference")
    rollout_dir = directory(prefix, "rollout")
    owners_dir = directory(rollout_dir, "owners")
    gateway = (_own_kind(nodes_dir), _own_kind(owners_dir), _read(replicas_dir))
    roles = [
        EtcdRole("lodestar-rollout", (_own_kind(rollout_dir), _own_kind(nodes_dir)), ("lodestar-rollout",)),
        EtcdRole("lodestar-trainer", (_read(replicas_dir),), ("lodestar-trainer",)),
        EtcdRole("lodestar-gateway", gateway, ("lodestar-gateway",)),
        EtcdRole("lodestar-inference", (_own_kind(replicas_dir),), ("lodestar-inference",)),
    ]
    for node in nodes:
        key = member_key(prefix, "nodes", _check_id(node, "node"), "node")
        name = f"lodestar-node-{node}"
        own = (_own_key(key), _own_kind(directory(owners_dir, node)), _read(replicas_dir))
        roles.append(EtcdRole(name, own, (name,)))
    for replica in replicas:
        key = member_key(prefix, "inference", _check_id(replica, "replica"), "replica")
        name = f"lodestar-inference-{replica}"
        roles.append(EtcdRole(name, (_own_key(key),), (name,)))
    return roles


def local_roles(prefix: str, users: list[str]) -> list[EtcdRole]:
    """`lodestar up --tls`: the deployment's roles for the local stack's CNs (its gateway is `lodestar-gateway`)."""
    return [role for role in deployment_roles(prefix) if set(role.users) & set(users)]
