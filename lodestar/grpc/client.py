"""gRPC client channels with retries on UNAVAILABLE and default deadlines.

Use `connect(target)` for every service-to-service channel: transient UNAVAILABLE (a server starting or
draining) is retried with exponential backoff by gRPC itself, and calls made without a timeout get
`default_timeout` (unary) so no call can hang forever. Streaming calls pass their own timeout.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from lodestar.grpc.security import current
from lodestar.grpc.server import MAX_MESSAGE_BYTES

DEFAULT_TIMEOUT_S = 30.0


def _service_config(max_attempts: int) -> str:
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{}],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


class _DefaultDeadline:
    """Gives calls made without a timeout the channel's default one."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None:
            return details
        return grpc.aio.ClientCallDetails(
            details.method, self._timeout, details.metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files each interceptor under the FIRST call kind it implements, so one class per kind.
class _UnaryUnaryDefaultDeadline(_DefaultDeadline, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnaryDefaultDeadline(_DefaultDeadline, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def split_targets(targets: str) -> list[str]:
    """The addresses of a comma-separated list ("a:50051, b:50051"), blanks dropped: several replicas of a
    service, or a leader and its standby."""
    return [target.strip() for target in targets.split(",") if target.strip()]


def connect(target: str, *, default_timeout: float = DEFAULT_TIMEOUT_S, max_attempts: int = 5) -> grpc.aio.Channel:
    """A channel to `target` ("host:port") with retries and default unary deadlines; TLS and the
    control-plane token come from the process's `lodestar.grpc.security.current()`."""
    return current().aio_channel(
        target,
        options=[
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _service_config(max_attempts)),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        interceptors=[_UnaryUnaryDefaultDeadline(default_timeout), _StreamUnaryDefaultDeadline(default_timeout)],
    )


LEADER_METADATA_KEY = "lodestar-leader"
"""Trailing metadata of an UNAVAILABLE answer from a follower: the leader's address (host:port)."""
T = TypeVar("T")


class _FailedCall(Protocol):
    """A failed call, sync (`grpc.Call` errors) or async (`grpc.aio.AioRpcError`)."""

    def code(self) -> grpc.StatusCode: ...

    def trailing_metadata(self) -> Any: ...


def leader_from_error(error: _FailedCall) -> str | None:
    """The leader a follower named in its UNAVAILABLE answer, if any (sync or async call errors)."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class LeaderChannel:
    """A channel that follows leader redirects: a unary call that a follower answers with UNAVAILABLE and
    the leader's address is retried there (at most `max_redirects` times), and the channel stays there.

        channel = LeaderChannel("127.0.0.1:50053")
        reply = await channel.call(lambda ch: RolloutServiceStub(ch).GetRun(request))
    """

    def __init__(self, target: str, *, max_redirects: int = 3, default_timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self._max_redirects = max_redirects
        self._default_timeout = default_timeout
        self.channel = connect(target, default_timeout=default_timeout)

    async def call(self, rpc: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
        for _ in range(self._max_redirects):
            try:
                return await rpc(self.channel)
            except grpc.aio.AioRpcError as error:
                leader = leader_from_error(error)
                if leader is None or leader == self.target:
                    raise
                await self.redirect(leader)
        return await rpc(self.channel)

    async def redirect(self, target: str) -> None:
        """Point the channel at `target` (e.g. a leader named by `leader_from_error` on a stream)."""
        old, self.target = self.channel, target
        self.channel = connect(target, default_timeout=self._default_timeout)
        await old.close()

    async def close(self) -> None:
        await self.channel.close()
