"""A status to a caller that went away is not an error: a standby's redirect, a mapped domain error (issue 44,
docs/chaos.md).

A real grpc.aio server with the RolloutService servicer of a standby (no core) behind the production
interceptor; a client (a thread, its own channel) cancels its call while the standby is still working out
where the leader is, so grpc cannot send the redirect (`context.abort` raises ExecuteBatchError). Before the
fix that was logged as an INTERNAL error with a traceback; now it is one info line and nothing at error level.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, cast

import grpc
import grpc.aio
import pytest
from structlog.testing import capture_logs

from lodestar.errors import NotFoundError
from lodestar.grpc.errors import RpcInterceptor
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_rollout.service import RolloutCore
from lodestar_rollout.servicer import RolloutServicer

LEADER = "127.0.0.1:1"


class _Held:
    """Holds the server's event loop once the call reached the servicer until the caller has cancelled it (as on
    a starved machine: the cancellation reaches grpc's core, not the handler)."""

    def __init__(self) -> None:
        self.asked, self.gone = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.asked.set()
        self.gone.wait(10)
        time.sleep(1.0)  # for the cancellation to reach the server's core


async def _call_and_leave(servicer: RolloutServicer, held: _Held, caplog: pytest.LogCaptureFixture) -> list[Any]:
    """GetRun on a real server behind the production interceptor, cancelled by its caller while `held`; the
    structlog records of the call (and no error-level record, structlog's or the stdlib's)."""
    server = grpc.aio.server(interceptors=[RpcInterceptor("rollout")])
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    def caller() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = rollout_pb2_grpc.RolloutServiceStub(channel).GetRun.future(rollout_pb2.GetRunRequest(run_id="r"))
            assert held.asked.wait(10)
            call.cancel()
            held.gone.set()

    caplog.set_level(logging.DEBUG)
    try:
        with capture_logs() as logs:
            client = threading.Thread(target=caller)
            client.start()
            await asyncio.to_thread(client.join)
            await asyncio.sleep(1.0)  # the handler ends after the held loop resumes
    finally:
        await server.stop(None)
    errors = [log for log in logs if log["log_level"] in ("error", "critical", "exception")]
    assert not errors, errors
    stdlib = [f"{record.name}: {record.getMessage()}" for record in caplog.records if record.levelno >= logging.ERROR]
    assert not stdlib, stdlib
    assert not any("exc_info" in log for log in logs)
    return logs


async def test_a_redirect_to_a_caller_that_went_away_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    held = _Held()

    def leader_address() -> str:
        """The standby's view of the leader, reached only after the caller cancelled."""
        held.hold()
        return LEADER

    logs = await _call_and_leave(RolloutServicer(lambda: None, leader_address), held, caplog)
    gone = [log for log in logs if log["event"] == "status not sent: the caller went away"]
    assert [(log["log_level"], log["code"], log["leader"]) for log in gone] == [("info", "UNAVAILABLE", LEADER)]


async def test_an_error_status_to_a_caller_that_went_away_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """The same for a domain error the interceptor maps (any servicer): NOT_FOUND, once the caller has gone."""
    held = _Held()

    class Core:
        def run_view(self, run_id: str) -> rollout_pb2.Run:
            held.hold()
            raise NotFoundError(f"no run {run_id!r}")

    logs = await _call_and_leave(RolloutServicer(lambda: cast(RolloutCore, Core()), lambda: None), held, caplog)
    gone = [log for log in logs if log["event"] == "status not sent: the caller went away"]
    assert [(log["log_level"], log["code"], log["method"]) for log in gone] == [
        ("info", "NOT_FOUND", "/lodestar.v1.RolloutService/GetRun")
    ]


async def test_a_caller_still_there_gets_the_redirect() -> None:
    server = grpc.aio.server(interceptors=[RpcInterceptor("rollout")])
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(lambda: None, lambda: LEADER), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await rollout_pb2_grpc.RolloutServiceStub(channel).GetRun(rollout_pb2.GetRunRequest(run_id="r"))
    finally:
        await server.stop(None)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("lodestar-leader", LEADER) in tuple(caught.value.trailing_metadata() or ())
