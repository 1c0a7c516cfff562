"""The inference replicas registered in etcd, for the trainer's weight pushes (`--inference-discovery etcd`).

The trainer is synchronous torch; the etcd watch is asyncio. `DiscoveredReplicas` runs a
`lodestar.inference_registry.ReplicaWatch` on an event loop of its own in a daemon thread and hands the
publisher a snapshot of the live replicas' addresses at each push (`addresses()`, thread-safe). Every push
goes to every replica registered at that moment: one that joined since the last push gets the full weights
of the new version then (gateways route to it only once it serves the fleet's version:
lodestar_gateway/replica_watch.py); one whose key went (drained, or dead for a lease TTL) is not pushed to.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

from lodestar.errors import DeadlineExceededError
from lodestar.etcd import EtcdTls
from lodestar.inference_registry import RegisteredReplica, ReplicaWatch
from lodestar.logging import get_logger
from lodestar.presence import DEFAULT_PREFIX

LIST_TIMEOUT_S = 30.0
"""How long the constructor waits for the first listing (etcd down: the first push finds no replica)."""
_log = get_logger("trainer.discovery")


class DiscoveredReplicas:
    """The live replicas' addresses, followed from etcd in a background thread (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        tls: EtcdTls | None = None,
        list_timeout_s: float = LIST_TIMEOUT_S,
    ) -> None:
        self._lock = threading.Lock()
        self._addresses: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replica-discovery", daemon=True)
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(endpoint, prefix, tls), self._loop)
        self._watch: ReplicaWatch = started.result()
        waiting = asyncio.run_coroutine_threadsafe(self._watch.wait_listed(list_timeout_s), self._loop)
        try:
            waiting.result()
        except DeadlineExceededError as error:
            _log.warning(
                "inference replicas not listed from etcd yet; pushes find them once it answers",
                etcd=endpoint,
                error=error.message,
            )

    async def _start(self, endpoint: str, prefix: str, tls: EtcdTls | None) -> ReplicaWatch:
        watch = ReplicaWatch(endpoint, self._changed, prefix=prefix, tls=tls)
        watch.start()
        return watch

    async def _changed(self, replicas: Mapping[str, RegisteredReplica]) -> None:
        addresses = sorted({replica.record.address for replica in replicas.values()})
        with self._lock:
            if addresses != self._addresses:
                _log.info("inference replicas", addresses=addresses)
            self._addresses = addresses

    def addresses(self) -> list[str]:
        """The addresses of the replicas registered now, sorted."""
        with self._lock:
            return list(self._addresses)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._watch.stop(), self._loop).result(timeout=10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)
        self._loop.close()
