"""Servicers that answer UNIMPLEMENTED for every RPC of a service, with a message naming the RPC.

Used for services whose behaviour has not landed yet: the server still starts, reports SERVING and
serves reflection, so clients and `grpcurl` can discover the full contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor

from lodestar.errors import UnimplementedError


def _unary(rpc: str) -> Callable[..., Any]:
    async def handler(self: Any, request: Any, context: Any) -> Any:
        raise UnimplementedError(f"{rpc} is not implemented by this server yet")

    return handler


def _streaming(rpc: str) -> Callable[..., AsyncIterator[Any]]:
    async def handler(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        raise UnimplementedError(f"{rpc} is not implemented by this server yet")
        yield  # pragma: no cover - makes this an async generator

    return handler


def unimplemented_servicer(base: type[Any], service: ServiceDescriptor) -> Any:
    """An instance of a subclass of `base` whose every RPC raises UnimplementedError."""
    methods = {
        method.name: (_streaming if method.server_streaming else _unary)(f"{service.full_name}/{method.name}")
        for method in service.methods
    }
    klass = type(f"Unimplemented{service.name}", (base,), methods)
    return klass()
