"""Inference replicas discovered in etcd (`--inference-discovery etcd`): the gateway's ReplicaSet follows them.

Replicas register under `<prefix>inference/` (`lodestar.inference_registry`); `ReplicaDiscovery` watches that
prefix and adds a replica to the ReplicaSet when it is admitted and removes it when its key goes (it drained,
or died and its lease expired). The router then places new sessions on the ring that includes the newcomer;
running sessions stay where they are unless their replica left (services/gateway/lodestar_gateway/routing.py).

Admission (`Admission`, pure): a replica is routed to once it serves the fleet's policy version — the
newest version an admitted replica serves. While no admitted replica lives, the fleet's version stays the
last one an admitted replica served (its floor) for `FLOOR_GRACE_S`: a replica that restarted with its
starting weights is not routed to just because the one that served the run's version paused past its lease
(the chaos hour served 14 calls at v0 that way while rollout knew v456); the gateway holds calls meanwhile
(`ReplicaSet`, `HOLD_S`) until a replica catches up (the trainer's catch-up push) or comes back. Only if
none reaches the floor within the grace does the fleet's version fall to the newest any live replica serves,
so a fleet restarted as a whole serves again (before any is admitted, that is the rule at once).
A replica that joins mid-run comes up with its starting weights; it waits, registered but unrouted, until
the trainer's next push (the trainer pushes every version to every registered replica) brings it to the
fleet's version, so no session samples from a policy the run left behind. Once admitted it stays while its
key lives, also while it lags a version during a push (every replica does, briefly); one that falls further
behind (it missed pushes: the trainer could not reach it) stops being routed to until it catches up. A key
rewritten under a new lease is a restarted process: it is admitted again only once it has caught up.

A replica killed and restarted faster than its lease expires may be called before its new registration is
seen here: each routed replica's record version (and lease, its incarnation) goes to the ReplicaSet as the
floor of its calls (`ReplicaSet.served`), which the restarted process refuses until it has caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

from lodestar.etcd import EtcdTls
from lodestar.inference_registry import RegisteredReplica, ReplicaWatch
from lodestar.logging import get_logger
from lodestar.presence import DEFAULT_PREFIX
from lodestar_gateway.replicas import ReplicaSet

_log = get_logger("gateway.discovery")
MAX_LAG = 1
"""Versions a routed replica may lag behind the fleet: one while a push is under way (the trainer pushes the
next version only once the last one landed everywhere it could), more only when it missed pushes."""

FLOOR_GRACE_S = 30.0
"""How long the fleet's version stays at its floor while no live replica serves it: longer than a paused
replica's lease plus its re-registration, and than the trainer's catch-up push (15 s of waiting, then the push)."""


@dataclass(frozen=True)
class _Admitted:
    lease_id: int
    address: str


class Admission:
    """Which registered replicas are routed to (see the module docstring)."""

    def __init__(self, *, grace_s: float = FLOOR_GRACE_S) -> None:
        self.grace_s = grace_s
        self._admitted: dict[str, _Admitted] = {}
        self.floor = 0
        """The fleet's version when an admitted replica last lived (0: none admitted yet)."""
        self._unmet_since: float | None = None
        self.recheck_in: float | None = None
        """Seconds until the floor's grace ends, while it holds every live replica back (None: it does not)."""
        self.waiting: dict[str, int] = {}
        """Registered replicas not admitted yet: address -> the version they serve."""
        self.routed: dict[str, RegisteredReplica] = {}
        """The admitted replicas by address, as last registered (keys that share an address: the last by key)."""

    def update(self, replicas: Mapping[str, RegisteredReplica], now: float | None = None) -> set[str]:
        """The addresses to route to, given every live replica by key (`now`: a monotonic clock reading)."""
        now = time.monotonic() if now is None else now
        live = {key: replica for key, replica in replicas.items() if replica.record.address}
        for key, admitted in list(self._admitted.items()):
            replica = live.get(key)
            if replica is None or (replica.lease_id, replica.record.address) != (admitted.lease_id, admitted.address):
                del self._admitted[key]  # gone, or a new process under the same key: it must catch up again
        if self._admitted:
            fleet = self.floor = max(live[key].record.policy_version for key in self._admitted)
            self._unmet_since = self.recheck_in = None
        else:
            fleet = self._fleet_without_admitted(live, now)
        for key in [key for key in self._admitted if live[key].record.policy_version < fleet - MAX_LAG]:
            del self._admitted[key]  # it missed pushes (the trainer cannot reach it): not routed until it catches up
        self.waiting = {}
        for key, replica in live.items():
            if key in self._admitted:
                continue
            if replica.record.policy_version >= fleet:
                self._admitted[key] = _Admitted(replica.lease_id, replica.record.address)
            else:
                self.waiting[replica.record.address] = replica.record.policy_version
        self.routed = {live[key].record.address: live[key] for key in sorted(self._admitted)}
        return set(self.routed)

    def _fleet_without_admitted(self, live: Mapping[str, RegisteredReplica], now: float) -> int:
        """The floor while its grace lasts and no live replica serves it; after, the newest a live one serves."""
        newest = max((replica.record.policy_version for replica in live.values()), default=0)
        if newest >= self.floor:
            self._unmet_since = self.recheck_in = None
            return newest
        if self._unmet_since is None:
            self._unmet_since = now
            _log.info("no live replica serves the fleet's version: holding it", floor=self.floor, newest=newest)
        waited = now - self._unmet_since
        if waited < self.grace_s:
            self.recheck_in = self.grace_s - waited
            return self.floor
        _log.warning(
            "no replica caught up with the fleet's version: serving the newest", floor=self.floor, newest=newest
        )
        self.floor, self._unmet_since, self.recheck_in = newest, None, None
        return newest


class ReplicaDiscovery:
    """Keeps a ReplicaSet equal to the admitted replicas in etcd (see the module docstring)."""

    def __init__(
        self,
        replicas: ReplicaSet,
        endpoint: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        tls: EtcdTls | None = None,
        floor_grace_s: float = FLOOR_GRACE_S,
    ) -> None:
        self.replicas = replicas
        self.admission = Admission(grace_s=floor_grace_s)
        self.watch = ReplicaWatch(endpoint, self._apply, prefix=prefix, tls=tls)
        self._logged_waiting: set[str] = set()
        self._lock = asyncio.Lock()
        self._recheck: asyncio.Task[None] | None = None
        self._registered: Mapping[str, RegisteredReplica] = {}

    def start(self) -> None:
        self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()
        if self._recheck is not None:
            self._recheck.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recheck

    async def _apply(self, registered: Mapping[str, RegisteredReplica]) -> None:
        async with self._lock:
            self._registered = registered
            await self._route(registered)
        if self.admission.recheck_in is not None and self._recheck is None:  # no etcd change may come to wake us
            self._recheck = asyncio.create_task(self._apply_later(self.admission.recheck_in))

    async def _apply_later(self, delay_s: float) -> None:
        """Apply the last registrations again once the floor's grace has ended."""
        await asyncio.sleep(delay_s + 0.01)
        self._recheck = None
        await self._apply(self._registered)

    async def _route(self, registered: Mapping[str, RegisteredReplica]) -> None:
        routed = self.admission.update(registered)
        current = set(self.replicas.clients)
        for address in sorted(routed - current):
            self.replicas.add(address)
        for address in sorted(current - routed):
            await self.replicas.remove(address)
        for address, replica in self.admission.routed.items():
            self.replicas.served(address, replica.record.policy_version, incarnation=replica.lease_id)
        waiting = set(self.admission.waiting)
        if waiting - self._logged_waiting:
            _log.info(
                "inference replicas wait for the fleet's policy version before they are routed to",
                waiting=self.admission.waiting,
            )
        self._logged_waiting = waiting
