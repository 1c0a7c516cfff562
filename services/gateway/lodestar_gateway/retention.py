"""How long a node keeps the sessions it captured: its disk is bounded by the sessions in flight plus a
retention window, not by every session it ever ran.

A session the node's lifecycle ran leaves the capture store `acknowledged_s` after rollout acknowledged its
result (rollout's store then holds every call), or `unacknowledged_s` after a result rollout never took (it
gave up reporting, or the session was left open by an earlier process of the node and closed at start):
kept longer, since the node may hold the only copy of its calls. Sessions opened through
`GatewayService.OpenSession` by other clients are theirs and never expire here. A sweeper deletes what has
expired every `sweep_s` (`CaptureStore.prune`) and drops it from the registry's memo of closed sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from lodestar.logging import get_logger
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.sessions import SessionRegistry

_log = get_logger("gateway.retention")


@dataclass(frozen=True)
class RetentionPolicy:
    acknowledged_s: float = 600.0
    unacknowledged_s: float = 86_400.0
    sweep_s: float = 60.0


class Retention:
    """Expires a node's captured sessions and sweeps them (see the module docstring)."""

    def __init__(self, store: CaptureStore, sessions: SessionRegistry, policy: RetentionPolicy) -> None:
        self.policy = policy
        self._store = store
        self._sessions = sessions
        self._sweeper: asyncio.Task[None] | None = None
        self.pruned = 0
        """Sessions deleted since start (for status and tests)."""

    async def reported(self, session_id: str, *, acknowledged: bool) -> None:
        """The result of gateway session `session_id` reached rollout (`acknowledged`) or never will."""
        keep = self.policy.acknowledged_s if acknowledged else self.policy.unacknowledged_s
        await self._store.expire(session_id, time.time() + keep)

    async def sweep(self) -> int:
        """Delete every expired session now; how many."""
        pruned = await self._store.prune(time.time())
        self._sessions.forget(pruned)
        self.pruned += len(pruned)
        if pruned:
            _log.info("captured sessions pruned", count=len(pruned))
        return len(pruned)

    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="capture-retention")

    async def close(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as error:  # a failed sweep is retried at the next tick; the node keeps serving
                _log.warning("capture retention sweep failed", error=str(error))
            await asyncio.sleep(self.policy.sweep_s)
