"""The server side of the control-plane credentials: an interceptor that authenticates each call's bearer
token against a `TokenTable` and authorizes its method from `roles.METHOD_ROLES`, before the handler runs.

- No token or an unknown one on a protected method: UNAUTHENTICATED.
- A known token whose roles may not call the method: PERMISSION_DENIED.
- Open methods (`roles.OPEN_METHODS`), health and reflection pass without a token.

A passing call runs with its `Principal` in a context variable (`caller()`), so a servicer can check what
depends on the request, such as a node token naming the node of the request (`check_node`).
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from lodestar.errors import PermissionDeniedError
from lodestar.grpc.roles import NODE, Principal, TokenTable, needs_token
from lodestar.logging import get_logger

AUTH_METADATA_KEY = "authorization"
_BEARER = b"Bearer "
_caller: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("lodestar_caller", default=None)
_log = get_logger("grpc.auth")


def caller() -> Principal | None:
    """The principal of the call being served (None: the server checks no tokens, or an open method)."""
    return _caller.get()


def check_node(node_id: str) -> None:
    """Refuse (PermissionDeniedError) a node token acting for another node; other principals pass."""
    principal = caller()
    if principal is None or NODE not in principal.roles or principal.identity is None:
        return
    if node_id != principal.identity:
        raise PermissionDeniedError(
            f"this token belongs to node {principal.identity!r}; it cannot act for node {node_id!r}"
        )


def _bearer(metadata: Any) -> bytes | None:
    for key, value in metadata or ():
        if key == AUTH_METADATA_KEY:
            given = value if isinstance(value, bytes) else str(value).encode()
            return given.removeprefix(_BEARER) if given.startswith(_BEARER) else None
    return None


class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates and authorizes every protected call (see the module docstring)."""

    def __init__(self, table: TokenTable) -> None:
        self._table = table

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not needs_token(method):
            return handler
        token = _bearer(handler_call_details.invocation_metadata)
        principal = self._table.principal(token) if token else None
        if principal is None:
            message = f"{method} needs a control-plane bearer token (metadata 'authorization: Bearer ...')"
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, message)
        if not principal.may_call(method):
            _log.warning("control-plane call refused to its role", method=method, caller=principal.name)
            message = f"{method} is not allowed to the {principal.name} token (docs/security.md, roles)"
            return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED, message)
        return _as(handler, principal)


def _codec(handler: grpc.RpcMethodHandler[Any, Any]) -> dict[str, Any]:
    return {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}


def _build(
    handler: grpc.RpcMethodHandler[Any, Any], unary: Callable[..., Any], stream: Callable[..., Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind and codec as `handler` running `unary` (unary response) or `stream`."""
    codec = _codec(handler)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, **codec)
    return grpc.unary_unary_rpc_method_handler(unary, **codec)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as `handler` that aborts with `code`: the servicer never runs."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    return _build(handler, refuse, refuse_stream)


def _behavior(handler: grpc.RpcMethodHandler[Any, Any]) -> Callable[..., Any]:
    if handler.request_streaming and handler.response_streaming:
        return handler.stream_stream  # type: ignore[return-value]
    if handler.request_streaming:
        return handler.stream_unary  # type: ignore[return-value]
    if handler.response_streaming:
        return handler.unary_stream  # type: ignore[return-value]
    return handler.unary_unary  # type: ignore[return-value]


def _as(handler: grpc.RpcMethodHandler[Any, Any], principal: Principal) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` running with `principal` as the `caller()`."""
    behavior = _behavior(handler)

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        _caller.set(principal)
        return await behavior(request, context)

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        _caller.set(principal)
        async for item in behavior(request, context):
            yield item

    if handler.response_streaming and inspect.iscoroutinefunction(behavior):  # writes with context.write()
        return _build(handler, unary, unary)
    return _build(handler, unary, stream)
