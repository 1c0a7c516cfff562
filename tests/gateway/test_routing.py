"""The affinity router (lodestar_gateway/routing.py): a session keeps its replica, sessions spread evenly,
a joining replica takes over only its share, a full replica is skipped, a failed one excluded."""

from __future__ import annotations

from collections import Counter

import pytest

from lodestar_gateway.routing import AffinityRouter

REPLICAS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
KEYS = [f"ses_{i:05d}" for i in range(3000)]


@pytest.mark.slow
def test_a_session_always_reaches_the_same_replica() -> None:
    router = AffinityRouter(REPLICAS)
    first = {key: router.pick(key) for key in KEYS}
    assert all(AffinityRouter(reversed(REPLICAS)).pick(key) == replica for key, replica in first.items())
    assert all(router.pick(key) == replica for key, replica in first.items())


@pytest.mark.slow
def test_sessions_spread_evenly() -> None:
    shares = Counter(AffinityRouter(REPLICAS).pick(key) for key in KEYS)
    assert set(shares) == set(REPLICAS)
    assert all(0.25 < count / len(KEYS) < 0.42 for count in shares.values()), shares


@pytest.mark.slow
def test_a_joining_replica_takes_only_its_share_of_new_sessions() -> None:
    before = {key: AffinityRouter(REPLICAS).place(key) for key in KEYS}
    grown = AffinityRouter([*REPLICAS, "10.0.0.4:50051"])
    after = {key: grown.place(key) for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "10.0.0.4:50051" for key in moved), "sessions move only to the new replica"
    assert 0.15 < len(moved) / len(KEYS) < 0.35


def test_running_sessions_stay_on_their_replica_until_it_leaves_or_fails() -> None:
    router = AffinityRouter(REPLICAS)
    before = {key: router.pick(key) for key in KEYS}
    router.add("10.0.0.4:50051")
    assert {key: router.pick(key) for key in KEYS} == before, "a join moves no running session"
    router.remove(REPLICAS[0])
    after = {key: router.pick(key) for key in KEYS}
    assert all(after[key] == before[key] for key in KEYS if before[key] != REPLICAS[0])
    assert all(after[key] != REPLICAS[0] for key in KEYS)
    key = KEYS[1]
    failed = after[key]
    assert failed is not None
    moved = router.pick(key, exclude={failed})
    assert moved not in (None, failed)
    assert router.pick(key) == moved, "it stays where it moved"


def test_a_placed_session_keeps_its_replica_under_load() -> None:
    router = AffinityRouter(REPLICAS, min_capacity=1)
    key = KEYS[2]
    home = router.pick(key)
    assert home is not None
    for _ in range(10):
        router.started(home)
    assert router.pick(key) == home
    assert router.place(key) != home, "a new session with that hash would go elsewhere"


def test_a_full_replica_is_skipped_for_the_next_one_on_the_ring() -> None:
    router = AffinityRouter(REPLICAS, load_factor=1.25, min_capacity=1)
    key = KEYS[0]
    owner = router.place(key)
    assert owner is not None
    for _ in range(4):  # the owner runs 4 calls, the others none: capacity ceil(1.25 * 5 / 3) = 3
        router.started(owner)
    spill = router.place(key)
    assert spill is not None
    assert spill != owner
    assert router.owner(key) == owner
    for _ in range(4):
        router.finished(owner)
    assert router.place(key) == owner, "a new session goes home once the owner has room"


def test_at_low_load_a_sessions_concurrent_calls_stay_home() -> None:
    router = AffinityRouter(REPLICAS)  # min_capacity 4
    key = KEYS[3]
    owner = router.place(key)
    assert owner is not None
    for _ in range(3):
        router.started(owner)
    assert router.place(key) == owner


def test_load_stays_within_the_bound_under_a_skewed_workload() -> None:
    router = AffinityRouter(REPLICAS, load_factor=1.25, min_capacity=1)
    hot = [KEYS[0]] * 30 + KEYS[1:31]  # new sessions placed while 60 calls start
    for key in hot:
        replica = router.place(key)
        assert replica is not None
        router.started(replica)
    assert max(router.loads.values()) <= router.capacity(extra=0), router.loads


def test_excluded_replicas_are_never_picked_and_none_left_is_none() -> None:
    router = AffinityRouter(REPLICAS)
    key = KEYS[7]
    owner = router.place(key)
    assert owner is not None
    other = router.place(key, exclude={owner})
    assert other not in (None, owner)
    assert router.pick(key, exclude=set(REPLICAS)) is None
    assert AffinityRouter().pick(key) is None
    with pytest.raises(ValueError, match="at least 1"):
        AffinityRouter(load_factor=0.5)
