"""The node's side of RolloutService: acquiring sessions and reporting results (the only node module that
imports grpc).

`RolloutLink` is what the lifecycle needs; `GrpcRollout` implements it over a channel with deadlines.
`complete_with_retries` retries a result on transient failures with bounded exponential backoff; a
FAILED_PRECONDITION answer means the attempt was superseded (fenced) and the result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc.aio

from lodestar.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    LodestarError,
    NotFoundError,
    UnavailableError,
)
from lodestar.grpc.client import LeaderChannel, split_targets
from lodestar.grpc.errors import error_from_rpc
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc

_log = get_logger("gateway.node.rollout")
ACQUIRE_TIMEOUT_S = 10.0
COMPLETE_TIMEOUT_S = 60.0
"""Per CompleteSession RPC (a result can be tens of MB)."""


@dataclass(frozen=True)
class Acquired:
    sessions: list[rollout_pb2.SessionAssignment]
    cancelled: list[rollout_pb2.SessionAttemptRef]


class RolloutLink(Protocol):
    async def acquire(
        self, node_id: str, lease_id: int, free_slots: int, in_flight: Sequence[rollout_pb2.SessionProgress]
    ) -> Acquired:
        """AcquireSessions; raises LodestarError."""
        ...

    async def complete(self, result: rollout_pb2.SessionResult, timeout_s: float) -> bool:
        """CompleteSession -> counted; FailedPreconditionError when fenced, other LodestarErrors."""
        ...


class GrpcRollout:
    """RolloutLink over gRPC, following the rollout leader: a follower's redirect (UNAVAILABLE naming the
    leader) is followed at once (`LeaderChannel`), and an address that does not answer at all is replaced
    by the next of the configured ones (`--rollout A,B`: leader and standby), so a node survives a
    leader failover."""

    def __init__(self, targets: str | Sequence[str]) -> None:
        addresses = split_targets(targets) if isinstance(targets, str) else list(targets)
        self.targets = [address for address in addresses if address]
        if not self.targets:
            raise InvalidArgumentError("--rollout needs at least one address")
        self._next = 1
        self._leader = LeaderChannel(self.targets[0], default_timeout=ACQUIRE_TIMEOUT_S)

    @property
    def target(self) -> str:
        return self._leader.target

    async def close(self) -> None:
        await self._leader.close()

    async def _call(self, rpc: Callable[[rollout_pb2_grpc.RolloutServiceStub], Any]) -> Any:
        """Run `rpc` on the current leader (the generated stubs type aio calls as sync: Any here)."""
        try:
            return await self._leader.call(lambda channel: rpc(rollout_pb2_grpc.RolloutServiceStub(channel)))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our own task is being cancelled
            # Not us: another call redirected the channel (leader change) and closing the old one cancelled
            # this call. Transient: the caller retries on the new channel.
            raise UnavailableError("the call was cut by a switch to another rollout address; retry") from None
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE and len(self.targets) > 1:
                target = self.targets[self._next % len(self.targets)]
                self._next += 1
                _log.warning("rollout unreachable; trying the next address", failed=self._leader.target, next=target)
                await self._leader.redirect(target)
            raise error_from_rpc(error) from None

    async def acquire(
        self, node_id: str, lease_id: int, free_slots: int, in_flight: Sequence[rollout_pb2.SessionProgress]
    ) -> Acquired:
        request = rollout_pb2.AcquireSessionsRequest(
            node_id=node_id, lease_id=lease_id, free_slots=free_slots, in_flight=in_flight
        )
        response: rollout_pb2.AcquireSessionsResponse = await self._call(
            lambda stub: stub.AcquireSessions(request, timeout=ACQUIRE_TIMEOUT_S)
        )
        return Acquired(list(response.sessions), list(response.cancelled))

    async def complete(self, result: rollout_pb2.SessionResult, timeout_s: float) -> bool:
        request = rollout_pb2.CompleteSessionRequest(result=result)
        response: rollout_pb2.CompleteSessionResponse = await self._call(
            lambda stub: stub.CompleteSession(request, timeout=timeout_s)
        )
        return response.counted


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    initial_s: float = 0.5
    max_s: float = 8.0
    rpc_timeout_s: float = COMPLETE_TIMEOUT_S


async def complete_with_retries(link: RolloutLink, result: rollout_pb2.SessionResult, policy: RetryPolicy) -> str:
    """Report `result` until it is accepted or definitely refused; returns what happened: "counted",
    "not_counted", "fenced" (a superseded attempt: dropped), "refused" (the result itself was rejected)
    or "gave_up" (every retry failed)."""
    delay = policy.initial_s
    for attempt in range(1, policy.attempts + 1):
        try:
            counted = await link.complete(result, policy.rpc_timeout_s)
        except FailedPreconditionError as error:
            _log.warning(
                "result fenced: the attempt was superseded; dropped",
                session_id=result.session_id,
                attempt=result.attempt,
                error=error.message,
            )
            return "fenced"
        except (InvalidArgumentError, NotFoundError) as error:
            _log.error(
                "result refused by rollout; dropped",
                session_id=result.session_id,
                attempt=result.attempt,
                error=error.message,
            )
            return "refused"
        except LodestarError as error:
            if attempt == policy.attempts:
                _log.error(
                    "CompleteSession failed; giving up",
                    session_id=result.session_id,
                    attempts=attempt,
                    error=error.message,
                )
                return "gave_up"
            _log.warning(
                "CompleteSession failed; retrying",
                session_id=result.session_id,
                attempt=attempt,
                retry_in_s=delay,
                error=error.message,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_s)
            continue
        return "counted" if counted else "not_counted"
    return "gave_up"
