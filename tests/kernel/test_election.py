"""Leader election on a real etcd: one leader at a time, failover when the leader's lease ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from lodestar import errors
from lodestar.election import Election
from lodestar.etcd import EtcdClient, KeyValue


@pytest.fixture
async def two_clients(etcd_endpoint: str) -> AsyncIterator[tuple[EtcdClient, EtcdClient]]:
    """Two independent clients (channels), as two rollout replicas would have."""
    async with EtcdClient(etcd_endpoint) as first, EtcdClient(etcd_endpoint) as second:
        yield first, second


async def test_failover_when_the_leaders_lease_is_revoked(two_clients, etcd_prefix: str) -> None:
    client_a, client_b = two_clients
    key = etcd_prefix + "leader"
    lease_a, lease_b = await client_a.grant_lease(10), await client_b.grant_lease(10)
    election_a, election_b = Election(client_a, key), Election(client_b, key)

    leadership_a = await election_a.campaign(lease_a, "replica-a", timeout=5)
    assert leadership_a.value == b"replica-a"
    campaign_b = asyncio.create_task(election_b.campaign(lease_b, "replica-b"))
    await asyncio.sleep(0.5)
    assert not campaign_b.done()  # one leader at a time
    leader = await election_b.leader()
    assert leader is not None
    assert leader.text == "replica-a"
    assert leader.lease_id == lease_a.id

    await lease_a.revoke()  # the leader's process ends its lease (or etcd expires it)
    started = time.monotonic()
    leadership_b = await asyncio.wait_for(campaign_b, timeout=5)
    assert time.monotonic() - started < 2.0  # woken by the watch, well before any TTL
    assert leadership_b.lease is lease_b
    leader = await election_a.leader()
    assert leader is not None
    assert leader.text == "replica-b"
    await lease_b.revoke()


@pytest.mark.slow
async def test_failover_when_the_leader_stops_refreshing(two_clients, etcd_prefix: str) -> None:
    """A leader process that dies stops its keepalive; the follower takes over within about a TTL."""
    client_a, client_b = two_clients
    key = etcd_prefix + "leader"
    lease_a, lease_b = await client_a.grant_lease(2), await client_b.grant_lease(2)
    await Election(client_a, key).campaign(lease_a, "a", timeout=5)
    campaign_b = asyncio.create_task(Election(client_b, key).campaign(lease_b, "b"))
    await asyncio.sleep(0.2)
    await lease_a.stop_keepalive()
    started = time.monotonic()
    leadership = await asyncio.wait_for(campaign_b, timeout=lease_a.ttl + 3)
    assert 0.5 < time.monotonic() - started < lease_a.ttl + 2
    assert leadership.value == b"b"
    await lease_b.revoke()


async def test_resign_hands_over_and_observe_follows(two_clients, etcd_prefix: str) -> None:
    client_a, client_b = two_clients
    key = etcd_prefix + "leader"
    lease_a, lease_b = await client_a.grant_lease(10), await client_b.grant_lease(10)
    observed: list[str | None] = []
    started_observing = asyncio.Event()

    async def observe() -> None:
        async for leader in Election(client_b, key).observe():
            observed.append(None if leader is None else leader.text)
            started_observing.set()
            if len(observed) == 4:
                return

    observer = asyncio.create_task(observe())
    await started_observing.wait()  # the observer has read the (empty) key before anyone campaigns
    leadership_a = await Election(client_a, key).campaign(lease_a, "a")
    campaign_b = asyncio.create_task(Election(client_b, key).campaign(lease_b, "b"))
    await asyncio.sleep(0.2)
    await leadership_a.resign()
    await asyncio.wait_for(campaign_b, timeout=5)
    await asyncio.wait_for(observer, timeout=5)
    assert observed == [None, "a", None, "b"]
    assert not lease_a.is_lost  # resigning leaves the lease alive
    await lease_a.revoke()
    await lease_b.revoke()


async def test_resign_never_deletes_a_successors_key(two_clients, etcd_prefix: str) -> None:
    client_a, client_b = two_clients
    key = etcd_prefix + "leader"
    lease_a, lease_b = await client_a.grant_lease(10), await client_b.grant_lease(10)
    stale = await Election(client_a, key).campaign(lease_a, "a")
    await lease_a.revoke()
    await Election(client_b, key).campaign(lease_b, "b", timeout=5)
    await stale.resign()  # a late resign from the old leader
    leader: KeyValue | None = await Election(client_a, key).leader()
    assert leader is not None
    assert leader.text == "b"
    await lease_b.revoke()


async def test_campaign_timeout_and_lost_lease(two_clients, etcd_prefix: str) -> None:
    client_a, client_b = two_clients
    key = etcd_prefix + "leader"
    lease_a, lease_b = await client_a.grant_lease(10), await client_b.grant_lease(10)
    await Election(client_a, key).campaign(lease_a, "a")

    with pytest.raises(errors.DeadlineExceededError, match="timed out"):
        await Election(client_b, key).campaign(lease_b, "b", timeout=0.3)

    waiting = asyncio.create_task(Election(client_b, key).campaign(lease_b, "b"))
    await asyncio.sleep(0.2)
    await lease_b.revoke()  # the campaigner's own lease ends while it waits
    with pytest.raises(errors.FailedPreconditionError, match="lost"):
        await asyncio.wait_for(waiting, timeout=3)
    await lease_a.revoke()


async def test_campaign_again_with_the_leaders_own_lease_returns_at_once(etcd_endpoint, etcd_prefix) -> None:
    async with EtcdClient(etcd_endpoint) as client:
        lease = await client.grant_lease(10)
        first = await Election(client, etcd_prefix + "leader").campaign(lease, "a")
        again = await Election(client, etcd_prefix + "leader").campaign(lease, "a", timeout=1)
        assert again.create_revision == first.create_revision
        await lease.revoke()
