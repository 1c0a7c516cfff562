"""The error-mapping interceptor on a real grpc.aio server built with GrpcServer, and `error_from_rpc`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar import errors
from lodestar.grpc.errors import STATUS_BY_ERROR, error_from_rpc, status_for

from .faulty_service import FaultyService, build_server, method

MAPPED = sorted(STATUS_BY_ERROR.items(), key=lambda item: item[0].__name__)


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = build_server(FaultyService())
    port = await server.start()
    await server.set_serving(True)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    await server.stop(0)


def test_every_domain_error_has_a_distinct_status() -> None:
    domain_errors = {klass for klass in vars(errors).values() if isinstance(klass, type)}
    domain_errors.discard(errors.LodestarError)
    assert set(STATUS_BY_ERROR) == {k for k in domain_errors if errors.LodestarError in k.__bases__}
    assert len(set(STATUS_BY_ERROR.values())) == len(STATUS_BY_ERROR)
    assert STATUS_BY_ERROR[errors.InternalError] == grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(("error", "code"), MAPPED, ids=[klass.__name__ for klass, _ in MAPPED])
async def test_unary_domain_error_becomes_its_status(channel, error, code) -> None:
    message = f"{error.__name__} for the caller: run r-1"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "Unary")(f"raise:{error.__name__}:{message}".encode(), timeout=5)
    assert caught.value.code() == code
    assert caught.value.details() == message
    back = error_from_rpc(caught.value)  # and the client side maps it back
    assert type(back) is error
    assert back.message == message


async def test_subclass_maps_to_its_nearest_base() -> None:
    class StaleAttemptError(errors.FailedPreconditionError):
        pass

    assert status_for(StaleAttemptError("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(errors.LodestarError("x")) == grpc.StatusCode.UNKNOWN


async def test_plain_exception_is_internal_and_leaks_nothing(channel) -> None:
    secret = "Traceback in /srv/secret/path.py: password=hunter2"
    with structlog.testing.capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "Unary")(f"crash:{secret}".encode(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    details = caught.value.details() or ""
    assert "hunter2" not in details
    assert "/srv" not in details
    assert "RuntimeError" not in details
    assert details == "internal error (see server log)"
    (line,) = [entry for entry in logs if entry.get("code") == "INTERNAL"]  # the details go to the log
    assert line["method"] == "/lodestar.test.Faulty/Unary"
    assert "hunter2" in str(line["exc_info"])


async def test_successful_rpc_logs_one_line(channel) -> None:
    with structlog.testing.capture_logs() as logs:
        assert await method(channel, "Unary")(b"ok:hello", timeout=5) == b"hello"
    rpc_lines = [entry for entry in logs if entry["event"] == "rpc"]
    assert len(rpc_lines) == 1
    assert rpc_lines[0]["code"] == "OK"
    assert rpc_lines[0]["method"] == "/lodestar.test.Faulty/Unary"
    assert rpc_lines[0]["duration_ms"] >= 0


async def test_explicit_abort_passes_through(channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "Unary")(b"abort:not yours", timeout=5)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == "not yours"


async def test_server_streaming_error_after_messages(channel) -> None:
    call = method(channel, "ServerStream")(b"raise:NotFoundError:run r-9 does not exist", timeout=5)
    received: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _collect(call, received)
    assert received == [b"1", b"2"]  # what was sent before the error still arrives
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "run r-9 does not exist"


async def _collect(call, into: list[bytes]) -> None:
    async for message in call:
        into.append(message)


async def test_server_streaming_crash_is_internal(channel) -> None:
    call = method(channel, "ServerStream")(b"crash:/srv/secret", timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _collect(call, [])
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "/srv/secret" not in (caught.value.details() or "")


async def test_server_streaming_success(channel) -> None:
    received = [message async for message in method(channel, "ServerStream")(b"ok:3", timeout=5)]
    assert received == [b"1", b"2", b"3"]


async def test_client_streaming_errors_are_mapped(channel) -> None:
    async def requests() -> AsyncIterator[bytes]:
        yield b"ok:first"
        yield b"raise:ResourceExhaustedError:tensor chunk over the limit"

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "ClientStream")(requests(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == "tensor chunk over the limit"

    async def fine() -> AsyncIterator[bytes]:
        yield b"ok:done"

    assert await method(channel, "ClientStream")(fine(), timeout=5) == b"done"


async def test_crashes_and_unmapped_statuses_are_internal_not_transient(channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "Unary")(b"crash:bug", timeout=5)
    assert isinstance(error_from_rpc(caught.value), errors.InternalError)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "Unary")(b"abort:who knows", timeout=5)
    assert isinstance(error_from_rpc(caught.value), errors.PermissionDeniedError)  # PERMISSION_DENIED


async def test_context_overflow_keeps_its_numbers_across_the_wire() -> None:
    class Overflowing(FaultyService):
        async def run(self, command: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            raise errors.ContextLengthExceededError(5000, 4096)

    server = build_server(Overflowing())
    port = await server.start()
    await server.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await method(channel, "Unary")(b"ok:x", timeout=5)
    finally:
        await server.stop(0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    back = error_from_rpc(caught.value)
    assert isinstance(back, errors.ContextLengthExceededError)
    assert (back.prompt_tokens, back.context_length) == (5000, 4096)
    assert back.message == "the prompt has 5000 tokens but the context length is 4096 tokens"


async def test_coroutine_streaming_servicer_passes_the_interceptor() -> None:
    """grpc's aio HealthServicer.Watch writes with context.write() instead of yielding."""
    server = build_server(FaultyService())
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            await server.set_serving(True)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
    finally:
        await server.stop(0)
