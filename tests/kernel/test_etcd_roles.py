"""etcd roles per key kind (`lodestar.etcd_roles`) on a real etcd with TLS, client certificates and auth on,
set up by `lodestar etcd setup-auth` as a deployment does, each client acting as its certificate's CN:

- a gateway node writes its own presence key and reads the replicas, and cannot write another node's key,
  an inference replica's key (a forged replica would receive the trainer's weights and token), the rollout
  leader or another node's ownership key; the shared gateway user writes node keys only;
- a replica writes its own registration and nothing else; the trainer only reads replicas;
- rollout elects itself and binds ownership keys to a node's lease; the real `Membership` and
  `ReplicaRegistration` register through it, the trainer's `list_replicas` sees only the real replica, and
  the node's leaving revokes its lease with the ownership key on it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestar import errors
from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.inference_registry import ReplicaRecord, ReplicaRegistration, list_replicas, replica_key
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar_app.cli.main import main
from lodestar_app.local import LocalCluster, LocalEtcdTls, find_etcd
from lodestar_gateway.membership import Membership, NodeRecord, node_key
from lodestar_rollout.leader import leader_key
from lodestar_rollout.leases import Ownership

pytestmark = pytest.mark.slow
PREFIX = "/lodestar/"
TIMEOUT_S = 3.0
NAMES = ("etcd", "client", "rollout", "trainer", "gateway", "inference", "node-a", "node-b", "inference-r1")
DENIED = "permission denied"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return ensure_local_pki(tmp_path_factory.mktemp("pki"), NAMES)


@pytest.fixture
async def etcd_url(tmp_path: Path, pki: LocalPki) -> AsyncIterator[str]:
    """etcd on https:// with --client-cert-auth, set up by `lodestar etcd setup-auth` for nodes a, b and
    replica r1."""
    cluster = LocalCluster(tmp_path / "etcd", etcd_binary=find_etcd())
    try:
        await cluster.start_etcd(timeout=20, tls=LocalEtcdTls(pki, (), prefix=PREFIX, auth=False))
        client = pki.identities["client"]
        argv = ["etcd", "setup-auth", "--etcd", cluster.etcd_url, "--etcd-tls-ca", str(pki.ca)]
        argv += ["--etcd-tls-cert", str(client.cert), "--etcd-tls-key", str(client.key)]
        argv += ["--node", "a", "--node", "b", "--replica", "r1"]
        assert await asyncio.to_thread(main, argv) == 0
        async with EtcdClient(cluster.etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "client")) as anyone:
            with pytest.raises(errors.UnauthenticatedError):  # auth is on: a CN that is no user reads nothing
                await anyone.get(node_key("a", PREFIX))
        yield cluster.etcd_url
    finally:
        await cluster.stop()


def as_user(pki: LocalPki, name: str) -> EtcdTls:
    own = pki.identities[name]
    return EtcdTls(ca=pki.ca, cert=own.cert, key=own.key)


def replica(replica_id: str, address: str) -> ReplicaRecord:
    return ReplicaRecord(replica_id, address, 0, "m", datetime.now(UTC))


async def refused(etcd: EtcdClient, key: str) -> None:
    with pytest.raises(errors.UnauthenticatedError, match=DENIED):
        await etcd.put(key, "forged")


async def test_a_node_writes_only_its_own_key_and_cannot_forge_a_replica(etcd_url: str, pki: LocalPki) -> None:
    forged = replica("evil", "attacker:50051").to_json()
    async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "node-a")) as node:
        lease = await node.grant_lease(10)
        await node.put(node_key("a", PREFIX), "{}", lease=lease)
        assert (await node.get_prefix(PREFIX + "inference/")).items == []  # it may read the replicas
        for key in (node_key("b", PREFIX), replica_key("evil", PREFIX), replica_key("r1", PREFIX)):
            with pytest.raises(errors.UnauthenticatedError, match=DENIED):
                await node.put(key, forged)
        await refused(node, leader_key(PREFIX))
        await refused(node, PREFIX + "rollout/owners/b/s-1/1")  # another node's session
        with pytest.raises(errors.UnauthenticatedError, match=DENIED):
            await node.delete(node_key("b", PREFIX))
        await lease.revoke()  # its own key only: allowed
    async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "gateway")) as shared:
        await shared.put(node_key("any-node", PREFIX), "{}")  # a node of a shared-certificate Deployment
        await refused(shared, replica_key("evil", PREFIX))
        await refused(shared, leader_key(PREFIX))
    for name in ("inference-r1", "inference"):
        async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, name)) as registered:
            await registered.put(replica_key("r1", PREFIX), replica("r1", "inference:50051").to_json())
            await refused(registered, node_key("a", PREFIX))
            await refused(registered, leader_key(PREFIX))
    async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "inference-r1")) as own:
        await refused(own, replica_key("r2", PREFIX))
    async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "trainer")) as trainer:
        found, _ = await list_replicas(trainer, PREFIX)
        assert [item.record.address for item in found.values()] == ["inference:50051"]
        await refused(trainer, replica_key("evil", PREFIX))


async def test_the_services_work_with_auth_on(etcd_url: str, pki: LocalPki) -> None:
    """Real registrations through the roles: a node (Membership), a replica (ReplicaRegistration), rollout's
    election key and ownership keys bound to the node's lease, read back by the trainer."""
    record = NodeRecord("a", "127.0.0.1:1", "http://127.0.0.1:2", "127.0.0.1:3", 4, datetime.now(UTC))
    membership = Membership(etcd_url, record, prefix=PREFIX, ttl=10, tls=as_user(pki, "node-a"))
    registration = ReplicaRegistration(
        etcd_url, replica("r1", "127.0.0.1:3"), prefix=PREFIX, ttl=10, tls=as_user(pki, "inference-r1")
    )
    membership.start()
    registration.start()
    try:
        await membership.wait_registered(timeout=10)
        await registration.wait_registered(timeout=10)
        async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "rollout")) as rollout:
            node = await rollout.get(node_key("a", PREFIX))
            assert node is not None
            assert node.lease_id
            assert (await rollout.create_if_absent(leader_key(PREFIX), "rollout:50053")).succeeded
            ownership = Ownership(rollout, PREFIX)
            await ownership.claim([("s-1", "a", 1)], node.lease_id)
            owners, _ = await ownership.snapshot()
            assert owners == {("s-1", 1): "a"}
        async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "trainer")) as trainer:
            found, _ = await list_replicas(trainer, PREFIX)
            assert [json.loads(item.record.to_json())["replica_id"] for item in found.values()] == ["r1"]
        await membership.stop()  # the node leaves: its lease, with the ownership key rollout bound to it, ends
        async with EtcdClient(etcd_url, timeout=TIMEOUT_S, tls=as_user(pki, "rollout")) as rollout:
            assert await rollout.get(node_key("a", PREFIX)) is None
            assert (await Ownership(rollout, PREFIX).snapshot())[0] == {}
    finally:
        await registration.stop()
        await membership.stop()
