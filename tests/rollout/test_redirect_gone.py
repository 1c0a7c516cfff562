"""A standby's redirect to a caller that went away is not an error (issue 44, docs/chaos.md).

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

import grpc
import grpc.aio
import pytest
from structlog.testing import capture_logs

from lodestar.grpc.errors import RpcInterceptor
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_rollout.servicer import RolloutServicer

LEADER = "127.0.0.1:1"


async def test_a_redirect_to_a_caller_that_went_away_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    asked, gone = threading.Event(), threading.Event()

    def leader_address() -> str:
        """The standby's view of the leader, reached only after the caller cancelled (the server's loop is
        held meanwhile, as on a starved machine: the cancellation reaches grpc's core, not the handler)."""
        asked.set()
        gone.wait(10)
        time.sleep(1.0)  # for the cancellation to reach the server's core
        return LEADER

    server = grpc.aio.server(interceptors=[RpcInterceptor("rollout")])
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(lambda: None, leader_address), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    def caller() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = rollout_pb2_grpc.RolloutServiceStub(channel).GetRun.future(rollout_pb2.GetRunRequest(run_id="r"))
            assert asked.wait(10)
            call.cancel()
            gone.set()

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
    redirects = [log for log in logs if log["event"] == "redirect not sent: the caller went away"]
    assert [(log["log_level"], log["leader"]) for log in redirects] == [("info", LEADER)]
    assert not any("exc_info" in log for log in logs)


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
