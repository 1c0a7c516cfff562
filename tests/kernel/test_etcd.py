"""The etcd wrapper against a real etcd: key/value, leases, watches, guarded transactions, errors."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest

from lodestar import errors
from lodestar.etcd import EtcdClient, EventKind, WatchEvent
from tests.waiting import eventually


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_endpoint, timeout=3.0) as client:
        yield client


async def test_put_get_delete_and_prefix(etcd: EtcdClient, etcd_prefix: str) -> None:
    first = await etcd.put(etcd_prefix + "b", "two")
    second = await etcd.put(etcd_prefix + "a", b"one")
    await etcd.put(etcd_prefix.rstrip("/") + "-sibling", "not under the prefix")
    assert second > first

    got = await etcd.get(etcd_prefix + "a")
    assert got is not None
    assert (got.key, got.value, got.text, got.version, got.lease_id) == (etcd_prefix + "a", b"one", "one", 1, 0)
    assert got.mod_revision == second
    assert await etcd.get(etcd_prefix + "missing") is None

    snapshot = await etcd.get_prefix(etcd_prefix)
    assert [item.key for item in snapshot.items] == [etcd_prefix + "a", etcd_prefix + "b"]
    assert snapshot.revision >= second

    assert await etcd.delete(etcd_prefix + "a") is True
    assert await etcd.delete(etcd_prefix + "a") is False
    assert await etcd.delete_prefix(etcd_prefix) == 1
    assert (await etcd.get_prefix(etcd_prefix)).items == []


@pytest.mark.slow
async def test_lease_keys_survive_with_keepalive_and_vanish_without(etcd: EtcdClient, etcd_prefix: str) -> None:
    kept = await etcd.grant_lease(2)
    dropped = await etcd.grant_lease(2, keepalive=False)
    assert kept.ttl >= 2
    await etcd.put(etcd_prefix + "kept", "x", lease=kept)
    await etcd.put(etcd_prefix + "dropped", "x", lease=dropped)
    assert (await etcd.get(etcd_prefix + "kept")).lease_id == kept.id  # type: ignore[union-attr]

    started_before, _ = keepalive_streams(etcd.endpoint)
    await asyncio.sleep(kept.ttl + 1.5)  # well past the TTL: only the refreshed lease holds its key
    started_after, handled_after = keepalive_streams(etcd.endpoint)
    refreshes = started_after - started_before
    assert 3 <= refreshes <= 8  # about every TTL/3, not a flood
    assert started_after - handled_after <= 1  # each refresh's stream was closed (one may be in flight)
    assert await etcd.get(etcd_prefix + "kept") is not None
    assert await etcd.get(etcd_prefix + "dropped") is None
    assert not kept.is_lost

    await kept.stop_keepalive()
    assert kept.is_lost
    stopped = time.monotonic()
    await eventually(lambda: _absent(etcd, etcd_prefix + "kept"), kept.ttl + 2.5, what="the unrefreshed key to expire")
    assert time.monotonic() - stopped > 0.5  # it expired by TTL, not at once


def keepalive_streams(endpoint: str) -> tuple[int, int]:
    """LeaseKeepAlive streams etcd has started and finished so far (from its Prometheus metrics)."""
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=5) as reply:
        metrics = reply.read().decode()
    started = handled = 0
    for line in metrics.splitlines():
        if 'grpc_method="LeaseKeepAlive"' not in line or line.startswith("#"):
            continue
        value = int(float(line.rsplit(" ", 1)[1]))
        if line.startswith("grpc_server_started_total"):
            started += value
        elif line.startswith("grpc_server_handled_total"):
            handled += value
    return started, handled


async def _absent(etcd: EtcdClient, key: str) -> bool:
    return await etcd.get(key) is None


async def test_revoke_deletes_keys_at_once(etcd: EtcdClient, etcd_prefix: str) -> None:
    async with await etcd.grant_lease(30) as lease:
        await etcd.put(etcd_prefix + "k", "v", lease=lease)
        assert await etcd.get(etcd_prefix + "k") is not None
    assert lease.is_lost
    assert lease.lost_reason == "revoked"
    assert await etcd.get(etcd_prefix + "k") is None
    with pytest.raises(errors.NotFoundError):
        await etcd.put(etcd_prefix + "k", "v", lease=lease)


async def test_keepalive_reports_a_lease_revoked_elsewhere(etcd_endpoint: str, etcd_prefix: str) -> None:
    async with EtcdClient(etcd_endpoint) as owner, EtcdClient(etcd_endpoint) as other:
        lease = await owner.grant_lease(2)
        started = time.monotonic()
        await other._revoke(lease.id)  # as if an operator or etcd itself ended it
        reason = await asyncio.wait_for(lease.wait_lost(), timeout=lease.ttl + 1)
        assert "expired" in reason
        assert time.monotonic() - started <= lease.ttl / 3 + 1


@pytest.mark.slow
async def test_keepalive_reports_loss_when_etcd_goes_away(private_etcd) -> None:
    async with EtcdClient(private_etcd.endpoint, timeout=1.0) as etcd:
        lease = await etcd.grant_lease(2)
        await etcd.put("/k", "v", lease=lease)
        private_etcd.stop()
        started = time.monotonic()
        reason = await asyncio.wait_for(lease.wait_lost(), timeout=lease.ttl + 2)
        assert "no keepalive answer" in reason
        # Declared a TTL after the last answered refresh was sent (up to TTL/3 before etcd went away):
        # never later than etcd itself could have expired it.
        assert lease.ttl * 2 / 3 - 0.2 <= time.monotonic() - started <= lease.ttl + 1.0


async def collect(watch, count: int) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async with asyncio.timeout(5):
        async for event in watch:
            events.append(event)
            if len(events) == count:
                break
    return events


async def test_watch_prefix_sees_puts_and_deletes_in_order(etcd: EtcdClient, etcd_prefix: str) -> None:
    async with await etcd.watch_prefix(etcd_prefix, prev_kv=True) as watch:
        await etcd.put(etcd_prefix + "a", "1")
        await etcd.put(etcd_prefix.rstrip("/") + "-elsewhere", "ignored")
        await etcd.put(etcd_prefix + "b", "2")
        await etcd.delete(etcd_prefix + "a")
        await etcd.put(etcd_prefix + "b", "3")
        events = await collect(watch, 4)
    assert [(e.kind, e.key.removeprefix(etcd_prefix), e.value) for e in events] == [
        (EventKind.PUT, "a", b"1"),
        (EventKind.PUT, "b", b"2"),
        (EventKind.DELETE, "a", b""),
        (EventKind.PUT, "b", b"3"),
    ]
    revisions = [e.revision for e in events]
    assert revisions == sorted(revisions)
    assert len(set(revisions)) == 4
    assert events[2].prev_value == b"1"
    assert events[3].prev_value == b"2"
    assert events[3].version == 2
    assert events[1].create_revision == events[3].create_revision


async def test_a_deletes_only_watch_gets_no_puts(etcd: EtcdClient, etcd_prefix: str) -> None:
    async with await etcd.watch_prefix(etcd_prefix, deletes_only=True) as watch:
        await etcd.put(etcd_prefix + "a", "1")
        await etcd.put(etcd_prefix + "b", "2")
        await etcd.delete(etcd_prefix + "a")
        await etcd.put(etcd_prefix + "a", "3")
        await etcd.delete(etcd_prefix + "b")
        events = await collect(watch, 2)
    assert [(e.kind, e.key.removeprefix(etcd_prefix)) for e in events] == [
        (EventKind.DELETE, "a"),
        (EventKind.DELETE, "b"),
    ]


async def test_watch_from_a_snapshot_revision_misses_nothing(etcd: EtcdClient, etcd_prefix: str) -> None:
    await etcd.put(etcd_prefix + "old", "before")
    snapshot = await etcd.get_prefix(etcd_prefix)
    await etcd.put(etcd_prefix + "new", "after the snapshot, before the watch")
    async with await etcd.watch_prefix(etcd_prefix, start_revision=snapshot.revision + 1) as watch:
        (event,) = await collect(watch, 1)
    assert (event.kind, event.key) == (EventKind.PUT, etcd_prefix + "new")


async def test_watch_cancel_ends_a_blocked_iteration(etcd: EtcdClient, etcd_prefix: str) -> None:
    watch = await etcd.watch_prefix(etcd_prefix)
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for event in watch:
            seen.append(event)

    consumer = asyncio.create_task(consume())
    await etcd.put(etcd_prefix + "x", "1")
    await eventually(lambda: seen, 5, interval_s=0.02, what="the first watch event")
    await watch.cancel()
    await asyncio.wait_for(consumer, timeout=2)  # the loop ended on its own, no exception
    await etcd.put(etcd_prefix + "x", "2")
    assert len(seen) == 1

    # A consumer task cancelled mid-iteration stops cleanly too; the client stays usable.
    async with await etcd.watch_prefix(etcd_prefix) as second:
        task = asyncio.create_task(collect(second, 1))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await etcd.get(etcd_prefix + "x") is not None


async def test_watch_breaks_with_unavailable_when_etcd_goes_away(private_etcd) -> None:
    async with EtcdClient(private_etcd.endpoint, timeout=1.0) as etcd:
        watch = await etcd.watch_prefix("/")
        private_etcd.stop()
        with pytest.raises(errors.UnavailableError):
            await asyncio.wait_for(_drain(watch), timeout=5)


async def _drain(watch) -> None:
    async for _ in watch:
        pass


async def test_create_if_absent(etcd: EtcdClient, etcd_prefix: str) -> None:
    key = etcd_prefix + "owner"
    created = await etcd.create_if_absent(key, "first")
    assert created.succeeded
    assert created.current is None
    assert created.revision > 0
    again = await etcd.create_if_absent(key, "second")
    assert not again.succeeded
    assert again.current is not None
    assert again.current.value == b"first"
    assert again.revision >= created.revision
    assert (await etcd.get(key)).value == b"first"  # type: ignore[union-attr]

    await etcd.delete(key)  # version back to 0: creatable again, here bound to a lease
    lease = await etcd.grant_lease(10)
    recreated = await etcd.create_if_absent(key, "third", lease=lease)
    assert recreated.succeeded
    assert (await etcd.get(key)).lease_id == lease.id  # type: ignore[union-attr]
    await lease.revoke()


async def test_compare_and_swap_and_delete(etcd: EtcdClient, etcd_prefix: str) -> None:
    key = etcd_prefix + "state"
    missing = await etcd.compare_and_swap(key, "x", expected_value="anything")
    assert not missing.succeeded
    assert missing.current is None

    revision = await etcd.put(key, "v1")
    assert (await etcd.compare_and_swap(key, "v2", expected_value="v1")).succeeded
    stale = await etcd.compare_and_swap(key, "v3", expected_value="v1")
    assert not stale.succeeded
    assert stale.current is not None
    assert stale.current.value == b"v2"

    stale_revision = await etcd.compare_and_swap(key, "v3", expected_mod_revision=revision)
    assert not stale_revision.succeeded
    current = stale_revision.current
    assert current is not None
    swapped = await etcd.compare_and_swap(key, "v3", expected_mod_revision=current.mod_revision)
    assert swapped.succeeded
    assert swapped.revision > current.mod_revision

    assert not (await etcd.compare_and_delete(key, expected_value="v2")).succeeded
    deleted = await etcd.compare_and_delete(key, expected_value="v3")
    assert deleted.succeeded
    assert deleted.revision > swapped.revision
    assert await etcd.get(key) is None

    with pytest.raises(errors.InvalidArgumentError, match="exactly one"):
        await etcd.compare_and_swap(key, "x")
    with pytest.raises(errors.InvalidArgumentError, match="exactly one"):
        await etcd.compare_and_swap(key, "x", expected_value="a", expected_mod_revision=1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_unreachable_etcd_is_unavailable_fast() -> None:
    async with EtcdClient(f"http://127.0.0.1:{_closed_port()}", timeout=2.0) as etcd:
        operations = (lambda: etcd.get("/k"), lambda: etcd.put("/k", "v"), lambda: etcd.grant_lease(5), etcd.ping)
        for operation in operations:
            started = time.monotonic()
            with pytest.raises(errors.UnavailableError, match=r"etcd http://127\.0\.0\.1"):
                await operation()
            assert time.monotonic() - started < 2.5


async def test_silent_etcd_is_unavailable_within_the_timeout() -> None:
    """A peer that accepts TCP but never speaks gRPC (a hung etcd) must not hang the caller."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        async with EtcdClient(endpoint, timeout=1.0) as etcd:
            operations = (
                lambda: etcd.get("/k"),
                lambda: etcd.create_if_absent("/k", "v"),
                lambda: etcd.watch_prefix("/"),
            )
            for operation in operations:
                started = time.monotonic()
                with pytest.raises(errors.UnavailableError):
                    await operation()
                assert time.monotonic() - started < 2.0  # the first waits out the timeout, then fail fast


async def test_ping_and_endpoint_validation(etcd: EtcdClient) -> None:
    assert (await etcd.ping()).startswith("3.")
    with pytest.raises(errors.InvalidArgumentError, match="http://host:port or https://host:port"):
        EtcdClient("unix://127.0.0.1:2379")
    with pytest.raises(errors.InvalidArgumentError):
        EtcdClient("localhost")
    with pytest.raises(errors.InvalidArgumentError, match="at least 1"):
        await etcd.grant_lease(0)
