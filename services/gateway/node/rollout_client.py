"""The node's side of RolloutService: acquiring sessions and reporting results (the only node module that
imports grpc).

`RolloutLink` is what the lifecycle needs; `GrpcRollout` implements it over a channel with deadlines.
`complete_with_retries` retries a result on transient failures with bounded exponential backoff; a
FAILED_PRECONDITION answer means the attempt was superseded (fenced) and the result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc.aio

from lodestar.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    LodestarError,
    NotFoundError,
)
from lodestar.grpc.errors import error_from_rpc
from lodestar.grpc.server import MAX_MESSAGE_BYTES
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
    """RolloutLink over gRPC."""

    def __init__(self, target: str) -> None:
        self.target = target
        # No channel-level retries (every call passes its own deadline): the lifecycle retries a result
        # itself, with its own budget, and polls again anyway.
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def acquire(
        self, node_id: str, lease_id: int, free_slots: int, in_flight: Sequence[rollout_pb2.SessionProgress]
    ) -> Acquired:
        request = rollout_pb2.AcquireSessionsRequest(
            node_id=node_id, lease_id=lease_id, free_slots=free_slots, in_flight=in_flight
        )
        try:
            response = await self._stub.AcquireSessions(request, timeout=ACQUIRE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise error_from_rpc(error) from None
        return Acquired(list(response.sessions), list(response.cancelled))

    async def complete(self, result: rollout_pb2.SessionResult, timeout_s: float) -> bool:
        request = rollout_pb2.CompleteSessionRequest(result=result)
        try:
            response = await self._stub.CompleteSession(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise error_from_rpc(error) from None
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
            _log.warning("result fenced: the attempt was superseded; dropped", session_id=result.session_id,
                         attempt=result.attempt, error=error.message)  # fmt: skip
            return "fenced"
        except (InvalidArgumentError, NotFoundError) as error:
            _log.error("result refused by rollout; dropped", session_id=result.session_id, attempt=result.attempt,
                       error=error.message)  # fmt: skip
            return "refused"
        except LodestarError as error:
            if attempt == policy.attempts:
                _log.error("CompleteSession failed; giving up", session_id=result.session_id, attempts=attempt,
                           error=error.message)  # fmt: skip
                return "gave_up"
            _log.warning("CompleteSession failed; retrying", session_id=result.session_id, attempt=attempt,
                         retry_in_s=delay, error=error.message)  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, policy.max_s)
            continue
        return "counted" if counted else "not_counted"
    return "gave_up"
