"""Mapping between domain errors and gRPC status codes, in both directions.

Servers: `RpcInterceptor` turns a raised `LodestarError` into its status code with the error's message,
turns any other exception into INTERNAL with a generic message (the details go to the log, never to the
caller), and logs one line per RPC. A status that cannot be sent because the caller went away (a process
killed mid-call) is one info line, not an error: `send_status` (also for servicers that abort themselves).
Clients: `error_from_rpc` turns an `AioRpcError` back into the domain error, so the gateway can answer a
harness in its own dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
import structlog

from lodestar import errors

STATUS_BY_ERROR: dict[type[errors.LodestarError], grpc.StatusCode] = {
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.CancelledError: grpc.StatusCode.CANCELLED,
    errors.UnimplementedError: grpc.StatusCode.UNIMPLEMENTED,
    errors.InternalError: grpc.StatusCode.INTERNAL,
}
ERROR_BY_STATUS: dict[grpc.StatusCode, type[errors.LodestarError]] = {
    **{code: error for error, code in STATUS_BY_ERROR.items()},
    grpc.StatusCode.UNKNOWN: errors.InternalError,  # an exception escaped a (non-lodestar) handler
    grpc.StatusCode.DATA_LOSS: errors.InternalError,
    grpc.StatusCode.ABORTED: errors.UnavailableError,  # a concurrency conflict: retrying may succeed
    grpc.StatusCode.OUT_OF_RANGE: errors.InvalidArgumentError,
}
TRANSIENT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)
"""The only codes a caller may retry (the rest are the caller's fault or a bug: retrying cannot help)."""
ERROR_REASON_KEY = "lodestar-error-reason"
"""Trailing metadata naming a structured error (`context_length_exceeded`), with its numbers alongside."""
_CONTEXT_REASON = "context_length_exceeded"

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

# Health checks and reflection are polled constantly; their per-RPC lines are logged at debug level.
_QUIET_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


def status_for(error: errors.LodestarError) -> grpc.StatusCode:
    """The gRPC status code of a domain error (its nearest mapped base class)."""
    for klass in type(error).__mro__:
        if klass in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[klass]
    return grpc.StatusCode.UNKNOWN


def error_from_rpc(error: grpc.aio.AioRpcError) -> errors.LodestarError:
    """The domain error for a failed call (INTERNAL/UNKNOWN and unmapped codes: InternalError, not retried);
    a context overflow comes back as ContextLengthExceededError with its numbers."""
    metadata = {key: value for key, value in error.trailing_metadata() or ()}
    return error_from_status(error.code(), error.details(), metadata)


def error_from_status(code: grpc.StatusCode, details: str | None, metadata: Mapping[str, Any]) -> errors.LodestarError:
    """The domain error for a status code, its details and its trailing metadata (see `error_from_rpc`)."""
    if code == grpc.StatusCode.INVALID_ARGUMENT and metadata.get(ERROR_REASON_KEY) == _CONTEXT_REASON:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            return errors.ContextLengthExceededError(
                int(metadata["lodestar-prompt-tokens"]), int(metadata["lodestar-context-length"])
            )
    klass = ERROR_BY_STATUS.get(code, errors.InternalError)
    return klass(details or code.name)


STATUS_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
"""google.rpc.Code numbers (as carried in a message, e.g. `GenerateError.code`) to status codes."""


async def send_status(
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    message: str,
    metadata: tuple[tuple[str, str], ...] = (),
    *,
    log: Any,
    **fields: Any,
) -> NoReturn:
    """End the call with `code` (`context.abort`). When grpc cannot send it (ExecuteBatchError: the caller went
    away before it was answered, e.g. a killed node), nothing is wrong here: one info line on `log` with
    `fields`, and the call ends cancelled."""
    try:
        await context.abort(code, message, trailing_metadata=metadata)
    except grpc.aio.AbortError:
        raise  # the status is on its way
    except Exception as error:
        log.info("status not sent: the caller went away", code=code.name, error=type(error).__name__, **fields)
        raise asyncio.CancelledError from error
    raise AssertionError("abort returned")  # pragma: no cover


def trailing_metadata(error: errors.LodestarError) -> tuple[tuple[str, str], ...]:
    """What a failed call carries besides its code and message (the numbers of a context overflow)."""
    if isinstance(error, errors.ContextLengthExceededError):
        return (
            (ERROR_REASON_KEY, _CONTEXT_REASON),
            ("lodestar-prompt-tokens", str(error.prompt_tokens)),
            ("lodestar-context-length", str(error.context_length)),
        )
    return ()


class RpcInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors to status codes and logs one line per RPC (method, code, duration)."""

    def __init__(self, service: str) -> None:
        self._log = structlog.get_logger(component=service)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        # The stubs type handler behaviours as sync callables; on an aio server they are coroutine
        # functions (unary responses) or async generator functions (streaming responses).
        behaviors: Any = handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, behaviors.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, behaviors.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        # Streaming behaviours are async generators, or coroutines that write with `context.write()`
        # (grpc's own aio HealthServicer.Watch); each is wrapped in its own kind.
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_streaming(method, behaviors.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_streaming(method, behaviors.stream_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_unary(
        self, method: str, behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                response = await behavior(request, context)
            except BaseException as error:
                await self._fail(method, context, error, started)
                raise
            self._done(method, context, started)
            return response

        return wrapped

    def _wrap_streaming(self, method: str, behavior: Any) -> Any:
        if inspect.iscoroutinefunction(behavior):
            return self._wrap_unary(method, behavior)
        return self._wrap_stream(method, behavior)

    def _wrap_stream(
        self, method: str, behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as error:
                await self._fail(method, context, error, started)
                raise
            self._done(method, context, started)

        return wrapped

    def _done(self, method: str, context: grpc.aio.ServicerContext[Any, Any], started: float) -> None:
        code = context.code() or grpc.StatusCode.OK
        code_name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        log = self._log.debug if method.startswith(_QUIET_PREFIXES) else self._log.info
        log("rpc", method=method, code=code_name, duration_ms=round((time.perf_counter() - started) * 1e3, 3))

    async def _fail(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        error: BaseException,
        started: float,
    ) -> None:
        """Log the failed RPC and abort it with the mapped status (re-raises for non-domain errors)."""
        duration_ms = round((time.perf_counter() - started) * 1e3, 3)
        if isinstance(error, errors.LodestarError):
            code = status_for(error)
            self._log.info("rpc", method=method, code=code.name, duration_ms=duration_ms, error=error.message)
            await send_status(context, code, error.message, trailing_metadata(error), log=self._log, method=method)
        if isinstance(error, Exception) and not isinstance(error, grpc.aio.AbortError):
            self._log.error("rpc", method=method, code="INTERNAL", duration_ms=duration_ms, exc_info=error)
            await send_status(
                context, grpc.StatusCode.INTERNAL, "internal error (see server log)", log=self._log, method=method
            )
        if isinstance(error, grpc.aio.AbortError):
            code = context.code()
            self._log.info("rpc", method=method, code=getattr(code, "name", str(code)), duration_ms=duration_ms)
