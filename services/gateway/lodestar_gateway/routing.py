"""Which inference replica serves a call: consistent hashing with bounded load on the session id (pure).

Every call of a session should reach the replica that served its earlier calls: that replica's prefix
cache holds the session's prompt, so a multi-turn agent session re-prefills only its new messages. A hash
ring with `VNODES` points per replica maps a session id to a replica; when replicas join or leave, only
the sessions of the ring arcs that changed owner move. Bounded load (Mirrokni, Thorup and Zadimoghaddam,
"Consistent Hashing with Bounded Loads", 2018) keeps a hot session set from overloading one replica: a
replica already serving ceil(`load_factor` x mean load) calls is skipped for the next replica on the
ring, so no replica serves more than `load_factor` times the mean (or `min_capacity` calls, at low load).
The bound places a session: its first call goes where the ring and the loads say, and every later call
follows it there (a sticky map of the last `STICKY_SESSIONS` sessions), whatever the loads, until that
replica leaves or fails a call. A replica that joins takes its share of new sessions; running sessions stay
where their prefix cache is.

    router = AffinityRouter(["a:50051", "b:50051"])
    replica = router.pick("ses_1234")      # the same replica for every call of the session
    router.started(replica); ...; router.finished(replica)
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict
from collections.abc import Collection, Iterable

VNODES = 64
"""Ring points per replica: enough that 3 replicas split sessions within a few percent of a third each."""
DEFAULT_LOAD_FACTOR = 1.25
STICKY_SESSIONS = 100_000
"""Sessions whose replica the router remembers (least recently used forgotten first; ~10 MB)."""
DEFAULT_MIN_CAPACITY = 4
"""Below this many calls in flight a replica is never full: an engine batches that many at no cost, and a
bound of ceil(1.25 x 2 / 3) = 1 at low load would move a session's second concurrent call for nothing."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class AffinityRouter:
    """A hash ring over replica names with per-replica in-flight counts (see the module docstring)."""

    def __init__(
        self,
        replicas: Iterable[str] = (),
        *,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        min_capacity: int = DEFAULT_MIN_CAPACITY,
    ) -> None:
        if load_factor < 1.0 or min_capacity < 1:
            raise ValueError("load_factor and min_capacity must be at least 1")
        self.load_factor = load_factor
        self.min_capacity = min_capacity
        self._ring: list[tuple[int, str]] = []
        self._points: list[int] = []
        self.loads: dict[str, int] = {}
        """Calls in flight per replica."""
        self._sticky: OrderedDict[str, str] = OrderedDict()
        for replica in replicas:
            self.add(replica)

    @property
    def replicas(self) -> list[str]:
        return sorted(self.loads)

    def add(self, replica: str) -> None:
        """A replica joins (no-op when present): it takes over its arcs of the ring."""
        if replica in self.loads:
            return
        self.loads[replica] = 0
        self._ring = sorted([*self._ring, *((_point(f"{replica}#{i}"), replica) for i in range(VNODES))])
        self._points = [point for point, _ in self._ring]

    def remove(self, replica: str) -> None:
        """A replica leaves: its sessions move to the next replicas on the ring."""
        if self.loads.pop(replica, None) is None:
            return
        self._ring = [(point, name) for point, name in self._ring if name != replica]
        self._points = [point for point, _ in self._ring]

    def capacity(self, extra: int = 1) -> int:
        """The most calls one replica may serve once `extra` more start: ceil(load_factor x mean), at least
        `min_capacity`."""
        total = sum(self.loads.values()) + extra
        return max(self.min_capacity, math.ceil(self.load_factor * total / max(1, len(self.loads))))

    def pick(self, key: str, exclude: Collection[str] = ()) -> str | None:
        """The replica for session `key`: where its earlier calls went, else (a new session, or its replica
        left or is in `exclude`, replicas that just failed) its place by ring and load; None when no replica
        is left."""
        placed = self._sticky.get(key)
        if placed is not None and placed in self.loads and placed not in exclude:
            self._sticky.move_to_end(key)
            return placed
        replica = self.place(key, exclude)
        if replica is not None:
            self._sticky[key] = replica
            self._sticky.move_to_end(key)
            while len(self._sticky) > STICKY_SESSIONS:
                self._sticky.popitem(last=False)
        return replica

    def place(self, key: str, exclude: Collection[str] = ()) -> str | None:
        """Where a new session `key` goes: its owner on the ring, or the next replica with room, skipping
        `exclude`; None when no replica is left."""
        if not self._ring:
            return None
        cap = self.capacity()
        start = bisect.bisect(self._points, _point(key))
        fallback: str | None = None
        seen: set[str] = set()
        for offset in range(len(self._ring)):
            replica = self._ring[(start + offset) % len(self._ring)][1]
            if replica in seen:
                continue
            seen.add(replica)
            if replica in exclude:
                continue
            if self.loads[replica] < cap:
                return replica
            fallback = fallback or replica
            if len(seen) == len(self.loads):
                break
        return fallback  # every candidate is at capacity (cannot happen with load_factor >= 1): the owner

    def owner(self, key: str) -> str | None:
        """The ring owner of `key`, whatever the loads."""
        if not self._ring:
            return None
        return self._ring[bisect.bisect(self._points, _point(key)) % len(self._ring)][1]

    def started(self, replica: str) -> None:
        if replica in self.loads:
            self.loads[replica] += 1

    def finished(self, replica: str) -> None:
        if self.loads.get(replica, 0) > 0:
            self.loads[replica] -= 1
