"""Capture: records are durable before the response completes (also across SIGKILL of a gateway process
and restarts), sequence order, longest-prefix continuation across interleaved chains, chain breaks."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from lodestar_gateway.server import CAPTURE_FILE
from tests.conftest import free_port
from tests.gateway.http import post, sse
from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends

REPO = Path(__file__).resolve().parents[2]


def _rows(database: Path, session_id: str) -> list[common_pb2.CallRecord]:
    """Records read straight from the SQLite file (request half + result half of each call)."""
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT r.record, c.record FROM calls c JOIN requests r ON r.call_id = c.call_id "
            "WHERE c.session_id = ? ORDER BY c.sequence",
            (session_id,),
        ).fetchall()
    records = []
    for request_half, result_half in rows:
        record = common_pb2.CallRecord()
        record.ParseFromString(request_half + result_half)
        records.append(record)
    return records


def test_record_is_committed_before_the_stream_ends(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "short answer"}]})
    database = gateway_stack.data_dir / "gateway" / CAPTURE_FILE
    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    seen_at_finish = None
    for event in sse(gateway_stack.http_base_url, "/v1/messages", body, key=session.key):
        if event.event == "message_delta":  # the first of the closing events
            seen_at_finish = _rows(database, session.session_id)
    assert seen_at_finish is not None
    (record,) = seen_at_finish
    assert record.completion.content[0].text.text == "short answer"
    assert record.dialect == common_pb2.DIALECT_ANTHROPIC_MESSAGES
    assert '"stream": true' in record.original_request_json
    assert len(record.completion_logprobs) == len(record.completion_token_ids) > 0
    assert record.finished_at.seconds >= record.started_at.seconds > 0


@pytest.mark.slow
def test_capture_survives_sigkill_of_the_gateway_process(gateway_stack: GatewayStack, tmp_path: Path) -> None:
    grpc_port, http_port = free_port(), free_port()
    data_dir = tmp_path / "killed-gateway"
    command = [
        sys.executable,
        "-m",
        "lodestar_app.cli.main",
        "gateway",
        "serve",
        "--port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        "--inference",
        gateway_stack.inference_address,
        "--data-dir",
        str(data_dir),
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 120  # a gateway process start; 30 s was missed on a loaded 2-core machine
            while True:
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.1)
            opened = gateway_pb2_grpc.GatewayServiceStub(channel).OpenSession(gateway_pb2.OpenSessionRequest())
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        reply = post(f"http://127.0.0.1:{http_port}", "/v1/chat/completions", body, key=opened.session.session_key)
        assert reply.status == 200
        os.kill(process.pid, signal.SIGKILL)  # no shutdown, no flush: only what was committed survives
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    (record,) = _rows(data_dir / CAPTURE_FILE, opened.session.session_id)
    assert record.completion.content[0].text.text == reply.json()["choices"][0]["message"]["content"]


def test_sessions_calls_and_chains_survive_a_restart(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "first"}, {"text": "second"}]})
    messages = [{"role": "user", "content": "one"}]
    first = post(
        gateway_stack.http_base_url, "/v1/chat/completions", {"model": "m", "messages": messages}, key=session.key
    ).json()
    gateway_stack.restart_gateway()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "two"}]
    reply = post(
        gateway_stack.http_base_url, "/v1/chat/completions", {"model": "m", "messages": messages}, key=session.key
    )
    assert reply.status == 200
    calls = gateway_stack.calls(session.session_id)
    assert [c.sequence for c in calls] == [0, 1]
    assert_chain_extends(calls)


def _chat(stack: GatewayStack, key: str, messages: list[dict[str, object]]) -> dict[str, object]:
    reply = post(stack.http_base_url, "/v1/chat/completions", {"model": "m", "messages": messages}, key=key)
    assert reply.status == 200, reply.body
    message: dict[str, object] = reply.json()["choices"][0]["message"]
    return message


def test_longest_prefix_not_last_call(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "r0"}, {"text": "r1"}, {"text": "r2"}]})
    key = session.key
    chain_a: list[dict[str, object]] = [{"role": "system", "content": "main"}, {"role": "user", "content": "task A"}]
    chain_b: list[dict[str, object]] = [{"role": "system", "content": "sub-agent"}, {"role": "user", "content": "B"}]
    chain_a.append(_chat(gateway_stack, key, chain_a))  # call 0
    chain_b.append(_chat(gateway_stack, key, chain_b))  # call 1 (a sub-agent's chain)
    chain_a.append({"role": "user", "content": "more"})
    chain_a.append(_chat(gateway_stack, key, chain_a))  # call 2 continues call 0, not the last call
    chain_b.append({"role": "user", "content": "go on"})
    _chat(gateway_stack, key, chain_b)  # call 3 continues call 1
    chain_a.append({"role": "user", "content": "again"})
    _chat(gateway_stack, key, chain_a)  # call 4 continues call 2 (the longest prefix), not call 0
    # The model's first answer comes back altered (as a re-serializing harness would): shared beyond the system
    # message, yet no earlier call is a prefix.
    edited = [*chain_a[:2], {"role": "assistant", "content": "r0, altered"}, {"role": "user", "content": "x"}]
    status = gateway_stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest())
    assert (status.chain_breaks, status.branches) == (0, 1)  # call 1 (the sub-agent) is a branch, not a drift
    _chat(gateway_stack, key, edited)  # call 5: an earlier message changed -> a new chain (a drift)
    status = gateway_stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest())
    assert (status.chain_breaks, status.branches) == (1, 1)  # the break is counted, not silent
    calls = gateway_stack.calls(session.session_id)
    assert [c.continued_from_sequence for c in calls] == [-1, -1, 0, 1, 2, -1]
    starts = [common_pb2.ChainStart.Name(c.chain_start).removeprefix("CHAIN_START_") for c in calls]
    assert starts == ["FIRST", "BRANCH", "CONTINUED", "CONTINUED", "CONTINUED", "DRIFT"]
    assert_chain_extends([calls[0], calls[2], calls[4]])
    assert_chain_extends([calls[1], calls[3]])
    assert calls[4].usage.continued_prompt_tokens == len(calls[2].prompt_token_ids) + len(calls[2].completion_token_ids)
