"""Synchronous gRPC channels for the training thread, and the mapping of their failures to domain errors.

The training loop is plain synchronous torch running in its own thread, so its clients (rollout's
StreamGroups and ReportPolicyVersion, inference's UpdateWeights) are synchronous gRPC stubs with the
same message limits as every lodestar channel; each call passes its own deadline.
"""

from __future__ import annotations

import grpc

from lodestar import errors
from lodestar.grpc.errors import ERROR_BY_STATUS
from lodestar.grpc.security import current
from lodestar.grpc.server import MAX_MESSAGE_BYTES

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Status codes after which the same call may be tried again."""


def sync_channel(target: str) -> grpc.Channel:
    """A synchronous channel to `target` ("host:port") with lodestar's message limits (TLS and token from
    the process's `lodestar.grpc.security.current()`)."""
    return current().sync_channel(
        target,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )


def status_of(error: grpc.RpcError) -> grpc.StatusCode:
    code = error.code() if isinstance(error, grpc.Call) else None
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def details_of(error: grpc.RpcError) -> str:
    details = error.details() if isinstance(error, grpc.Call) else None
    return details or status_of(error).name


def domain_error(error: grpc.RpcError, what: str) -> errors.LodestarError:
    """The domain error for a failed call, its message prefixed with `what` ("UpdateWeights to host:port")."""
    klass = ERROR_BY_STATUS.get(status_of(error), errors.UnavailableError)
    return klass(f"{what}: {details_of(error)}")
