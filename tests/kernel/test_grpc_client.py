"""`lodestar.grpc.client.connect`: retries on UNAVAILABLE and a default deadline for unary calls."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from lodestar.grpc.client import connect

from .faulty_service import FaultyService, build_server, method


@pytest.fixture
async def served() -> AsyncIterator[tuple[FaultyService, str]]:
    service = FaultyService()
    server = build_server(service)
    port = await server.start()
    await server.set_serving(True)
    yield service, f"127.0.0.1:{port}"
    await server.stop(0)


async def test_unavailable_is_retried_until_it_succeeds(served) -> None:
    service, target = served
    async with connect(target, max_attempts=5) as channel:
        reply = await method(channel, "Unary")(b"flaky:a:3", timeout=10)
    assert reply == b"4"  # three UNAVAILABLE answers were retried by the channel, the fourth call won
    assert service.calls["a"] == 4


async def test_retries_are_bounded(served) -> None:
    service, target = served
    async with connect(target, max_attempts=3) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Unary")(b"flaky:b:10", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "b: failing call 3 of 10"
    assert service.calls["b"] == 3


@pytest.mark.parametrize(
    ("error", "code"),
    [("FailedPreconditionError", grpc.StatusCode.FAILED_PRECONDITION), ("InternalError", grpc.StatusCode.INTERNAL)],
)
async def test_other_errors_are_not_retried(served, error: str, code: grpc.StatusCode) -> None:
    """A caller's fault or a bug (INTERNAL) is answered at once: retrying cannot help."""
    service, target = served
    async with connect(target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Unary")(f"flaky:c-{error}:1:{error}".encode(), timeout=10)
    assert caught.value.code() == code
    assert service.calls[f"c-{error}"] == 1


async def test_default_deadline_applies_to_unary_calls(served) -> None:
    _, target = served
    async with connect(target, default_timeout=0.3) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Unary")(b"sleep:3")  # no timeout given: the channel's default applies
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.5

        # A timeout given by the caller wins over the default.
        assert await method(channel, "Unary")(b"sleep:0.5", timeout=5) == b"slept"

        async def one() -> AsyncIterator[bytes]:
            yield b"sleep:3"

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "ClientStream")(one())  # client-streaming calls get it too
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
