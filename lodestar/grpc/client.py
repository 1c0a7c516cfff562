"""gRPC client channels with retries on UNAVAILABLE and default deadlines.

Use `connect(target)` for every service-to-service channel: transient UNAVAILABLE (a server starting or
draining) is retried with exponential backoff by gRPC itself, and calls made without a timeout get
`default_timeout` (unary) so no call can hang forever. Streaming calls pass their own timeout.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import grpc.aio

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


def connect(target: str, *, default_timeout: float = DEFAULT_TIMEOUT_S, max_attempts: int = 5) -> grpc.aio.Channel:
    """An insecure channel to `target` ("host:port") with retries and default unary deadlines."""
    return grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _service_config(max_attempts)),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        interceptors=[_UnaryUnaryDefaultDeadline(default_timeout), _StreamUnaryDefaultDeadline(default_timeout)],
    )
