"""Raw HTTP against a running gateway: sessions and keys, error shapes and statuses of every dialect,
body limits, unavailable inference, model listing, exact stream event sequences, real streaming and
cancellation on disconnect."""

from __future__ import annotations

import json
import sqlite3
import time

import grpc
import pytest

from lodestar.v1 import common_pb2, gateway_pb2
from lodestar_gateway.server import CAPTURE_FILE
from tests.gateway.cases import COUNT, STREAM_PATHS, VALID, error_message, streaming
from tests.gateway.conftest import StackFactory
from tests.gateway.http import post, request, sse
from tests.gateway.stack import GatewayStack, OpenedSession
from tests.waiting import wait_until

DIALECTS = list(VALID)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_unknown_missing_and_closed_keys_are_401(gateway_stack: GatewayStack, dialect: str) -> None:
    path, body = VALID[dialect]
    base = gateway_stack.http_base_url
    for key in (None, "lsk-unknown"):
        reply = post(base, path, body, key=key)
        assert reply.status == 401
        error_message(dialect, 401, reply.json())
    opened = gateway_stack.open_session()
    assert post(base, path, body, key=opened.key).status == 200
    gateway_stack.close_session(opened.session_id)
    reply = post(base, path, body, key=opened.key)
    assert reply.status == 401
    assert "closed" in error_message(dialect, 401, reply.json())
    assert len(gateway_stack.calls(opened.session_id)) == 1


def test_every_key_header_form_is_accepted(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    base = gateway_stack.http_base_url
    path, body = VALID["chat"]
    bearer = {"Authorization": f"Bearer {session.key}"}
    assert post(base, path, body, headers=bearer).status == 200
    google_path, google_body = VALID["google"]
    assert post(base, google_path, google_body, headers={"x-goog-api-key": session.key}).status == 200
    assert post(base, f"{google_path}?key={session.key}", google_body).status == 200
    assert post(base, google_path.replace("v1beta", "v1"), google_body, key=session.key).status == 200
    assert len(gateway_stack.calls(session.session_id)) == 4


def test_session_rpcs(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    stub = gateway_stack.stub()
    got = stub.GetSession(gateway_pb2.GetSessionRequest(session_id=session.session_id))
    assert got.session.state == gateway_pb2.SESSION_STATE_OPEN
    assert got.session.session_key == ""  # only OpenSession hands out the key
    assert got.session.labels["test"] == "gateway"
    for rpc in (stub.GetSession, stub.CloseSession):
        with pytest.raises(grpc.RpcError) as missing:
            rpc(type(rpc).__name__ and gateway_pb2.GetSessionRequest(session_id="ses_nope"))  # type: ignore[arg-type]
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    status = stub.GetNodeStatus(gateway_pb2.GetNodeStatusRequest())
    assert status.http_base_url == gateway_stack.http_base_url
    assert status.inference_target == gateway_stack.inference_address
    assert status.open_sessions == 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_bad_bodies_are_4xx_in_dialect_shape(gateway_stack: GatewayStack, session: OpenedSession, dialect: str) -> None:
    path = VALID[dialect][0]
    base = gateway_stack.http_base_url
    cases = [
        (post(base, path, raw=b'{"model": "m", "messages": [', key=session.key), 400, "malformed JSON"),
        (post(base, path, raw=b"[1, 2]", key=session.key), 400, "expected an object"),
        (
            post(
                base, path, raw=b"a=b", key=session.key, headers={"Content-Type": "application/x-www-form-urlencoded"}
            ),
            415,
            "content type",
        ),
        (post(base, path, raw=b"[" * 100_000, key=session.key), 400, "JSON"),
    ]
    for reply, status, words in cases:
        assert reply.status == status, reply.body
        assert words in error_message(dialect, status, reply.json())
    assert gateway_stack.calls(session.session_id) == []


def test_tool_result_without_call_and_empty_messages(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    base = gateway_stack.http_base_url
    orphan = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "out"}],
    }
    reply = post(base, "/v1/chat/completions", orphan, key=session.key)
    assert reply.status == 400
    assert "no matching tool call" in error_message("chat", 400, reply.json())
    reply = post(base, "/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}, key=session.key)
    assert "at least one" in error_message("anthropic", 400, reply.json())
    google = {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {}}}]}]}
    reply = post(base, "/v1beta/models/m:generateContent", google, key=session.key)
    assert "no matching functionCall" in error_message("google", 400, reply.json())


def test_over_long_prompt_is_400(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    words = " ".join(f"w{i % 9973}" for i in range(70_000))
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": words}]}
    reply = post(gateway_stack.http_base_url, "/v1/messages", body, key=session.key)
    assert reply.status == 400
    message = error_message("anthropic", 400, reply.json())  # Anthropic's own words (Claude Code reacts to them)
    assert message.startswith("prompt is too long: ")
    assert message.endswith(" tokens > 65536 maximum")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_oversized_body_is_413(gateway_stack_factory: StackFactory, dialect: str) -> None:
    stack = gateway_stack_factory(max_body_bytes=4096)
    opened = stack.open_session()
    path, body = VALID[dialect]
    big = json.loads(json.dumps(body).replace('"hi"', json.dumps("x" * 10_000)))
    reply = post(stack.http_base_url, path, big, key=opened.key)
    assert reply.status == 413
    error_message(dialect, 413, reply.json())
    assert post(stack.http_base_url, path, body, key=opened.key).status == 200


@pytest.mark.slow
def test_unavailable_inference_is_retryable(gateway_stack_factory: StackFactory) -> None:
    stack = gateway_stack_factory(inference=False)
    opened = stack.open_session()
    expected = {"anthropic": 529, "chat": 503, "responses": 503, "google": 503}
    for dialect, (path, body) in VALID.items():
        reply = post(stack.http_base_url, path, body, key=opened.key)
        assert reply.status == expected[dialect]
        message = error_message(dialect, reply.status, reply.json())
        assert "127.0.0.1" not in message  # no internal addresses leak
    assert (
        post(stack.http_base_url, "/v1/messages", {**VALID["anthropic"][1], "stream": True}, key=opened.key).json()[
            "error"
        ]["type"]
        == "overloaded_error"
    )
    assert stack.calls(opened.session_id) == []


def test_models_root_and_unknown_paths(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    base = gateway_stack.http_base_url
    assert request(base, "HEAD", "/").status == 200
    models = request(base, "GET", "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"]
    assert request(base, "GET", "/v1beta/models").json()["models"][0]["name"].startswith("models/")
    assert request(base, "GET", "/v1/models/claude-x").json()["id"] == "claude-x"
    missing = request(base, "GET", "/v1/nothing-here")
    assert missing.status == 404
    error_message("chat", 404, missing.json())
    wrong_method = request(base, "GET", "/v1/messages")
    assert wrong_method.status == 405
    error_message("anthropic", 405, wrong_method.json())
    unknown_method = post(base, "/v1beta/models/m:embedContent", {}, key=session.key)
    assert unknown_method.status == 404
    error_message("google", 404, unknown_method.json())
    for dialect, (path, body) in COUNT.items():
        reply = post(base, path, body, key=session.key)
        assert reply.status == 200
        assert next(iter(reply.json().values())) > 0, dialect


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_event_sequences(gateway_stack: GatewayStack, session: OpenedSession, dialect: str) -> None:
    gateway_stack.set_script(
        {
            "replies": [
                {"reasoning": "hm", "text": "Hello there", "tool_calls": [{"name": "ls", "arguments": {"path": "."}}]}
            ]
        }
    )
    _, body = VALID[dialect]
    tools = {
        "anthropic": [{"name": "ls", "input_schema": {"type": "object"}}],
        "chat": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
        "responses": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}],
        "google": [{"functionDeclarations": [{"name": "ls", "parameters": {"type": "object"}}]}],
    }[dialect]
    events = list(
        sse(
            gateway_stack.http_base_url,
            STREAM_PATHS[dialect],
            {**streaming(dialect, body), "tools": tools},
            key=session.key,
        )
    )
    if dialect == "anthropic":
        names = [e.event for e in events]
        assert names[0] == "message_start"
        assert names[-2:] == ["message_delta", "message_stop"]
        starts = [e.json()["content_block"]["type"] for e in events if e.event == "content_block_start"]
        assert starts == ["thinking", "text", "tool_use"]
        assert names.count("content_block_stop") == 3
        assert events[-2].json()["delta"]["stop_reason"] == "tool_use"
    elif dialect == "chat":
        assert events[-1].data == "[DONE]"
        chunks = [e.json() for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello there"
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    elif dialect == "responses":
        names = [e.event for e in events]
        assert names[:2] == ["response.created", "response.in_progress"]
        assert names[-1] == "response.completed"
        assert [e.json()["sequence_number"] for e in events] == list(range(len(events)))
        added = [e.json()["item"]["type"] for e in events if e.event == "response.output_item.added"]
        assert added == ["reasoning", "message", "function_call"]
        assert names.count("response.output_item.done") == 3
        final = events[-1].json()["response"]
        assert [item["type"] for item in final["output"]] == added
    else:
        chunks = [e.json() for e in events]
        assert "finishReason" not in chunks[0]["candidates"][0]
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert chunks[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"] == {"path": "."}
        assert chunks[-1]["usageMetadata"]["totalTokenCount"] > 0


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.slow
def test_tokens_are_streamed_as_generated(gateway_stack: GatewayStack, session: OpenedSession, dialect: str) -> None:
    words = "one two three four five six seven eight nine ten eleven twelve"
    gateway_stack.set_script({"token_delay_s": 0.1, "replies": [{"text": words}]})
    _, body = VALID[dialect]
    events = list(sse(gateway_stack.http_base_url, STREAM_PATHS[dialect], streaming(dialect, body), key=session.key))
    content = [e for e in events if "two" in e.data or "one" in e.data]
    assert content, [e.data for e in events]
    # The first words arrive while the rest is still being generated (>= 0.1 s per token).
    assert events[-1].at - content[0].at > 0.5


def test_client_disconnect_cancels_generation(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"token_delay_s": 0.05, "replies": [{"text": "word " * 200}]})
    node = gateway_stack.node
    assert node is not None
    inner = node.proxy._inference
    finished: list[float] = []

    class Watching:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        async def generate(self, request: object):  # type: ignore[no-untyped-def]
            try:
                async for event in inner.generate(request):  # type: ignore[arg-type]
                    yield event
            finally:
                finished.append(time.perf_counter())

    node.proxy._inference = Watching()  # type: ignore[assignment]
    body = {**VALID["chat"][1], "stream": True}
    started = time.perf_counter()
    for event in sse(gateway_stack.http_base_url, "/v1/chat/completions", body, key=session.key):
        if "word" in event.data:
            break  # closes the connection
    wait_until(lambda: finished, 5, interval_s=0.02, what="the generation to stop")
    assert finished[0] - started < 3.0  # the full reply would take ~10 s
    assert gateway_stack.calls(session.session_id) == []  # not answered, not captured
    database = gateway_stack.data_dir / "gateway" / CAPTURE_FILE

    def request_halves() -> int:
        with sqlite3.connect(database) as db:
            return int(db.execute("SELECT COUNT(*) FROM requests").fetchone()[0])

    # and its request half, written during generation, is dropped
    wait_until(request_halves, 5, what="the unanswered call's request half discarded", until=lambda n: n == 0)


def test_max_tokens_stop_reasons(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "a long answer that will not fit in three tokens at all"}]})
    base, key = gateway_stack.http_base_url, session.key
    messages = [{"role": "user", "content": "hi"}]
    anthropic = post(base, "/v1/messages", {"model": "m", "max_tokens": 3, "messages": messages}, key=key).json()
    assert anthropic["stop_reason"] == "max_tokens"
    assert anthropic["usage"]["output_tokens"] == 3
    chat = post(base, "/v1/chat/completions", {"model": "m", "max_tokens": 3, "messages": messages}, key=key).json()
    assert chat["choices"][0]["finish_reason"] == "length"
    events = list(
        sse(base, "/v1/responses", {"model": "m", "max_output_tokens": 3, "input": "hi", "stream": True}, key=key)
    )
    assert events[-1].event == "response.completed"
    assert events[-1].json()["response"]["status"] == "incomplete"
    assert events[-1].json()["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    google = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 3}}
    reply = post(base, "/v1beta/models/m:generateContent", google, key=key).json()
    assert reply["candidates"][0]["finishReason"] == "MAX_TOKENS"
    calls = gateway_stack.calls(session.session_id)
    assert all(call.finish_reason == common_pb2.FINISH_REASON_LENGTH for call in calls)
    assert all(len(call.completion_token_ids) == 3 for call in calls)
