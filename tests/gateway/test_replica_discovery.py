"""Inference replicas discovered in etcd (lodestar_gateway/replica_watch.py): the admission rule on its own,
then a gateway's ReplicaSet following real registrations in a real etcd (join, catch up, restart, leave),
and a gateway node that refuses discovery without etcd."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.inference_registry import RegisteredReplica, ReplicaRecord, ReplicaRegistration
from lodestar_gateway.replica_watch import Admission, ReplicaDiscovery
from lodestar_gateway.replicas import ReplicaSet
from lodestar_gateway.server import GatewayNode
from lodestar_gateway.settings import GatewaySettings
from tests.waiting import eventually


def _replica(name: str, version: int, lease: int = 1) -> tuple[str, RegisteredReplica]:
    record = ReplicaRecord(name, f"{name}:1", version, "tiny", datetime.now(UTC))
    return f"/k/{name}", RegisteredReplica(f"/k/{name}", record, lease)


def test_admission_routes_a_newcomer_only_once_it_serves_the_fleets_version() -> None:
    admission = Admission()
    assert admission.update(dict([_replica("a", 0), _replica("b", 0)])) == {"a:1", "b:1"}
    assert admission.update(dict([_replica("a", 3), _replica("b", 2)])) == {"a:1", "b:1"}, "a lag mid-push"
    assert admission.update(dict([_replica("a", 3), _replica("b", 3), _replica("c", 0)])) == {"a:1", "b:1"}
    assert admission.waiting == {"c:1": 0}
    assert admission.update(dict([_replica("a", 3), _replica("b", 3), _replica("c", 3)])) == {"a:1", "b:1", "c:1"}
    assert admission.update(dict([_replica("a", 4), _replica("b", 4), _replica("c", 0, lease=2)])) == {"a:1", "b:1"}, (
        "a restarted process (new lease) catches up again"
    )
    assert admission.update(dict([_replica("a", 6), _replica("b", 4), _replica("c", 5, lease=2)])) == {"a:1"}, (
        "b missed two pushes: no longer routed to; c has not caught up"
    )
    assert admission.update(dict([_replica("a", 6), _replica("b", 6), _replica("c", 6, lease=2)])) == {
        "a:1", "b:1", "c:1"
    }  # fmt: skip
    assert admission.update({}) == set()


def test_the_fleets_version_holds_while_no_live_replica_serves_it() -> None:
    """The chaos hour: one replica restarted at v0 while the only one at the run's version paused past its lease;
    the fleet's version fell to 0 and the restarted one served 14 calls at v0. Now the fleet's version stays
    for a grace: a replica that comes back, or catches up, is routed to; only after the grace does the newest
    any live one serves become the fleet's (a fleet restarted as a whole serves again)."""
    admission = Admission(grace_s=30)
    assert admission.update(dict([_replica("a", 456), _replica("b", 456)]), now=0) == {"a:1", "b:1"}
    assert admission.update(dict([_replica("a", 0, lease=2), _replica("b", 456)]), now=1) == {"b:1"}
    assert admission.update(dict([_replica("a", 0, lease=2)]), now=2) == set(), "b's key expired: a stays unrouted"
    assert admission.waiting == {"a:1": 0}
    assert admission.recheck_in == 30
    assert admission.update(dict([_replica("a", 0, lease=2), _replica("b", 456, lease=3)]), now=8) == {"b:1"}, (
        "b resumed and registered again at the fleet's version"
    )
    assert admission.recheck_in is None

    assert admission.update(dict([_replica("a", 0, lease=2)]), now=9) == set()
    assert admission.update(dict([_replica("a", 457, lease=2)]), now=20) == {"a:1"}, "the trainer's push reached a"

    assert admission.update(dict([_replica("c", 0, lease=4)]), now=21) == set()
    assert admission.update(dict([_replica("c", 0, lease=4)]), now=21 + 29.9) == set()
    assert admission.update(dict([_replica("c", 0, lease=4)]), now=21 + 30) == {"c:1"}, (
        "after the grace the newest a live replica serves is the fleet's"
    )
    assert admission.floor == 0


async def test_a_replica_set_follows_the_replicas_registered_in_etcd(etcd_endpoint: str, etcd_prefix: str) -> None:
    replicas = ReplicaSet(())
    discovery = ReplicaDiscovery(replicas, etcd_endpoint, prefix=etcd_prefix)

    def registration(name: str, version: int) -> ReplicaRegistration:
        record = ReplicaRecord(name, f"127.0.0.1:{9000 + len(name)}", version, "tiny", datetime.now(UTC))
        return ReplicaRegistration(etcd_endpoint, record, ttl=2, prefix=etcd_prefix)

    a, b, late = registration("a", 0), registration("bb", 0), registration("late", 0)
    try:
        for keeper in (a, b):
            keeper.start()
            await keeper.wait_registered(10)
        discovery.start()
        await discovery.watch.wait_listed(10)
        assert set(replicas.clients) == {a.record.address, b.record.address}
        assert replicas.router.pick("session-1") in replicas.clients

        before = {f"early{i}": replicas.router.pick(f"early{i}") for i in range(30)}
        a.publish(2)
        b.publish(2)
        late.start()  # joins at version 0 while the fleet serves 2: registered, not routed to
        await eventually(lambda: late.record.address in discovery.admission.waiting, 10, what="the newcomer seen")
        assert late.record.address not in replicas.clients
        late.publish(2)  # the trainer's next push reached it
        await eventually(lambda: late.record.address in replicas.clients, 10, what="the newcomer admitted")
        assert {s: replicas.router.pick(s) for s in before} == before, "running sessions stay where they are"
        placed = {replicas.router.pick(f"new{i}") for i in range(30)}
        assert late.record.address in placed, "new sessions spread onto the newcomer"

        sticky = {f"s{i}": replicas.router.pick(f"s{i}") for i in range(30)}
        await a.stop()  # drains: gone at once, its sessions move, the others stay where they were
        await eventually(lambda: a.record.address not in replicas.clients, 5, what="the drained replica removed")
        for session, home in sticky.items():
            now = replicas.router.pick(session)
            assert now != a.record.address
            if home != a.record.address:
                assert now == home, "a session whose replica lives kept it"
    finally:
        await discovery.stop()
        for keeper in (a, b, late):
            await keeper.stop()
        await replicas.close()


def test_discovery_needs_etcd(tmp_path: Path) -> None:
    settings = GatewaySettings(port=0, http_port=0, data_dir=tmp_path, inference_discovery="etcd")
    with pytest.raises(InvalidArgumentError, match="needs --etcd"):
        GatewayNode(settings)
