"""Inference replicas in a real etcd (lodestar/inference_registry.py): a registration's key carries its record
and follows published versions; a watch hands over the live map on every join, update and leave, a replica
whose keepalive stops vanishes a TTL later, and a watch survives etcd going away."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.etcd import EtcdClient
from lodestar.inference_registry import (
    RegisteredReplica,
    ReplicaRecord,
    ReplicaRegistration,
    ReplicaWatch,
    list_replicas,
    replica_key,
)
from tests.conftest import EtcdServer
from tests.etcd_support import restart_etcd
from tests.waiting import eventually

TTL_S = 2


def _record(replica_id: str, port: int, version: int = 0) -> ReplicaRecord:
    return ReplicaRecord(replica_id, f"127.0.0.1:{port}", version, "tiny", datetime.now(UTC))


class Seen:
    """The maps a watch handed over, newest last."""

    def __init__(self) -> None:
        self.maps: list[dict[str, tuple[str, int]]] = []

    async def __call__(self, replicas: Mapping[str, RegisteredReplica]) -> None:
        self.maps.append({r.record.replica_id: (r.record.address, r.record.policy_version) for r in replicas.values()})

    @property
    def last(self) -> dict[str, tuple[str, int]]:
        return self.maps[-1] if self.maps else {}


def test_a_record_round_trips_and_bad_ids_are_refused() -> None:
    record = _record("r1", 5, 3)
    assert ReplicaRecord.from_json(record.to_json()) == record
    with pytest.raises(InvalidArgumentError):
        ReplicaRecord.from_json(b'{"replica_id": "x"}')
    with pytest.raises(InvalidArgumentError):
        replica_key("a/b")


async def test_a_watch_follows_joins_versions_and_leaves(etcd_endpoint: str, etcd_prefix: str) -> None:
    seen = Seen()
    watch = ReplicaWatch(etcd_endpoint, seen, prefix=etcd_prefix)
    first = ReplicaRegistration(etcd_endpoint, _record("r1", 1001), ttl=TTL_S, prefix=etcd_prefix)
    second = ReplicaRegistration(etcd_endpoint, _record("r2", 1002), ttl=TTL_S, prefix=etcd_prefix)
    try:
        first.start()
        await first.wait_registered(10)
        watch.start()
        await watch.wait_listed(10)
        assert seen.last == {"r1": ("127.0.0.1:1001", 0)}

        second.start()
        await eventually(lambda: "r2" in seen.last, 10, what="the second replica joining")
        first.publish(4)
        await eventually(lambda: seen.last.get("r1") == ("127.0.0.1:1001", 4), 10, what="the new version")
        async with EtcdClient(etcd_endpoint) as client:
            listed, _ = await list_replicas(client, etcd_prefix)
        assert {r.record.replica_id: r.record.policy_version for r in listed.values()} == {"r1": 4, "r2": 0}

        await first.stop()  # drains: the key goes at once
        await eventually(lambda: set(seen.last) == {"r2"}, 5, what="the first replica leaving")
    finally:
        await watch.stop()
        await first.stop()
        await second.stop()


@pytest.mark.slow  # waits out a lease TTL
async def test_a_dead_replica_vanishes_after_its_ttl(etcd_endpoint: str, etcd_prefix: str) -> None:
    seen = Seen()
    watch = ReplicaWatch(etcd_endpoint, seen, prefix=etcd_prefix)
    dying = ReplicaRegistration(etcd_endpoint, _record("dying", 1003), ttl=TTL_S, prefix=etcd_prefix)
    try:
        dying.start()
        await dying.wait_registered(10)
        watch.start()
        await eventually(lambda: "dying" in seen.last, 10, what="the replica listed")
        await dying.abandon()  # a SIGKILL, as far as etcd can tell: no more keepalives, no revoke
        await eventually(lambda: "dying" not in seen.last, TTL_S + 5, what="the lease expiring")
    finally:
        await watch.stop()


@pytest.mark.slow  # an etcd of its own, stopped and restarted
async def test_the_watch_keeps_its_map_while_etcd_is_down_and_lists_again(
    private_etcd: EtcdServer, etcd_prefix: str
) -> None:
    seen = Seen()
    endpoint = private_etcd.endpoint
    watch = ReplicaWatch(endpoint, seen, prefix=etcd_prefix, retry_max_s=0.5)
    replica = ReplicaRegistration(endpoint, _record("r1", 1004), ttl=5, prefix=etcd_prefix, retry_max_s=0.5)
    late = ReplicaRegistration(endpoint, _record("late", 1005), ttl=5, prefix=etcd_prefix, retry_max_s=0.5)
    try:
        replica.start()
        await replica.wait_registered(10)
        watch.start()
        await eventually(lambda: "r1" in seen.last, 10, what="the replica listed")
        private_etcd.stop()
        late.start()  # registers once etcd is back
        assert seen.last == {"r1": ("127.0.0.1:1004", 0)}, "the map is kept while etcd is away"
        restart_etcd(private_etcd)
        await eventually(lambda: set(seen.last) == {"r1", "late"}, 20, what="the listing after etcd came back")
    finally:
        await watch.stop()
        await replica.stop()
        await late.stop()


async def test_a_second_stop_returns_once_the_first_has_revoked(etcd_endpoint: str, etcd_prefix: str) -> None:
    """A server's drain and its shutdown both stop the registration, and overlap when nothing is in flight:
    the shutdown's stop must not close the client under the drain's revoke (the key would outlive the drain
    by a TTL), and returns only once the key is gone."""
    registration = ReplicaRegistration(etcd_endpoint, _record("r1", 1001), ttl=60, prefix=etcd_prefix)
    registration.start()
    await registration.wait_registered(10)
    drain = asyncio.ensure_future(registration.stop())
    for _ in range(10_000):  # loop turns, until the drain's stop has taken the lease to revoke
        if registration.lease is None:
            break
        await asyncio.sleep(0)
    else:
        pytest.fail("the drain's stop never took the lease")
    await registration.stop()
    async with EtcdClient(etcd_endpoint) as client:
        listed, _ = await list_replicas(client, etcd_prefix)
    assert listed == {}, "revoked at once, not left to expire a TTL later"
    await drain
