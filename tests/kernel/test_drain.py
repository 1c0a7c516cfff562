"""SIGTERM drains a real server process: in-flight RPCs finish, new ones are refused, health flips to
NOT_SERVING, and the process exits 0 well within its drain time."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .faulty_service import SERVICE, method

SCRIPT = Path(__file__).with_name("faulty_service.py")
DRAIN_SECONDS = 8.0


async def _read_line(process: asyncio.subprocess.Process, timeout: float = 20.0) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), timeout)
    return line.decode().strip()


async def _wait_for_line(process: asyncio.subprocess.Process, wanted: str) -> str:
    while True:
        line = await _read_line(process)
        if not line and process.stdout is not None and process.stdout.at_eof():
            pytest.fail(f"server exited before printing {wanted!r}")
        if line.startswith(wanted):
            return line


@pytest.fixture
async def server_process():
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--drain-seconds",
        str(DRAIN_SECONDS),
        stdout=asyncio.subprocess.PIPE,
        cwd=SCRIPT.parents[2],
    )
    try:
        port = int((await _wait_for_line(process, "PORT ")).split()[1])
        yield process, f"127.0.0.1:{port}"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
async def test_sigterm_drains_in_flight_rpcs_and_refuses_new_ones(server_process) -> None:
    process, target = server_process
    async with grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert (await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=DRAIN_SECONDS)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING

        slow = asyncio.ensure_future(method(channel, "Unary")(b"sleep:1.5", timeout=10))
        await _wait_for_line(process, "started sleep")  # the RPC is running on the server

        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # Health flips to NOT_SERVING (seen on a watch opened before the signal) ...
        flipped = await asyncio.wait_for(watch.read(), timeout=2)
        assert flipped.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()

        # ... a new RPC is refused, on the same channel and on a new one ...
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await method(channel, "Unary")(b"ok:too late", timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(target) as fresh:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await method(fresh, "Unary")(b"ok:too late", timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        # ... while the RPC that was in flight completes normally.
        assert await asyncio.wait_for(slow, timeout=5) == b"slept"

    code = await asyncio.wait_for(process.wait(), timeout=DRAIN_SECONDS)
    assert code == 0
    assert time.monotonic() - signalled < DRAIN_SECONDS / 2  # it stopped when the work was done
    assert await _wait_for_line(process, "drained") == "drained"


@pytest.mark.slow
async def test_drain_cancels_rpcs_that_outlive_the_grace(tmp_path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--drain-seconds", "0.5", stdout=asyncio.subprocess.PIPE, cwd=SCRIPT.parents[2]
    )
    try:
        port = int((await _wait_for_line(process, "PORT ")).split()[1])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stuck = asyncio.ensure_future(method(channel, "Unary")(b"sleep:30", timeout=30))
            await _wait_for_line(process, "started sleep")
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as cancelled:
                await asyncio.wait_for(stuck, timeout=5)
            assert cancelled.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert await asyncio.wait_for(process.wait(), timeout=5) == 0
        assert time.monotonic() - signalled < 3
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
