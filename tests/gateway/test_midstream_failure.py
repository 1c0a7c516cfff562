"""Inference failing in the middle of a stream, end to end through the gateway (scripted engine with
`fail_after_tokens`): each dialect ends the already-started 200 stream with its own in-stream error signal
(never its success terminator), each official SDK raises, no CallRecord is left for the unanswered call,
and the session goes on: the next call is captured with the next sequence number and chains to the last
ANSWERED call. A failure before the first token keeps the plain 503/529 error response.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from lodestar_gateway.server import CAPTURE_FILE
from tests.gateway.cases import STREAM_PATHS, error_message
from tests.gateway.http import SseEvent, post, sse
from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends
from tests.waiting import wait_until

DIALECTS = ["anthropic", "chat", "responses", "google"]
FIRST, SECOND = "First answer.", "Second answer, after the retry."
LONG = "The quick brown fox jumps over the lazy dog, again and again and again."
FAILING = {"text": LONG, "fail_after_tokens": 6}
UNAVAILABLE = "the model backend is unavailable; retry shortly"


def body(dialect: str, turns: list[str]) -> dict[str, Any]:
    """A streaming request whose conversation alternates user / assistant, starting with the user."""
    roles = ["user", "assistant"]
    if dialect == "google":
        contents = [{"role": ["user", "model"][i % 2], "parts": [{"text": text}]} for i, text in enumerate(turns)]
        return {"contents": contents}
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]
    if dialect == "anthropic":
        return {"model": "m", "max_tokens": 200, "messages": messages, "stream": True}
    if dialect == "chat":
        return {"model": "m", "messages": messages, "stream": True}
    return {"model": "m", "input": messages, "stream": True}


def stream(stack: GatewayStack, session: OpenedSession, dialect: str, turns: list[str]) -> list[SseEvent]:
    # A short timeout: a stream left open after the failure would fail the test instead of hanging it.
    return list(sse(stack.http_base_url, STREAM_PATHS[dialect], body(dialect, turns), key=session.key, timeout=15))


def streamed_text(dialect: str, events: list[SseEvent]) -> str:
    if dialect == "anthropic":
        deltas = [e.json()["delta"] for e in events if e.event == "content_block_delta"]
        return "".join(d.get("text", "") for d in deltas)
    if dialect == "chat":
        chunks = [e.json() for e in events if e.data != "[DONE]" and "choices" in e.json()]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    if dialect == "responses":
        return "".join(e.json()["delta"] for e in events if e.event == "response.output_text.delta")
    chunks = [e.json() for e in events if "candidates" in e.json()]
    return "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])


def assert_failed_stream(dialect: str, events: list[SseEvent]) -> None:
    """The stream carried part of the answer, then exactly the dialect's error signal, then ended."""
    partial = streamed_text(dialect, events)
    assert partial, events
    assert LONG.startswith(partial), partial
    assert partial != LONG
    last = events[-1]
    if dialect == "anthropic":
        assert last.event == "error"
        assert last.json() == {"type": "error", "error": {"type": "overloaded_error", "message": UNAVAILABLE}}
        names = [e.event for e in events]
        assert "message_delta" not in names
        assert "message_stop" not in names
    elif dialect == "chat":
        assert last.event is None
        assert last.json() == {"error": {"message": UNAVAILABLE, "type": "server_error", "param": None, "code": None}}
        assert all(e.data != "[DONE]" for e in events)
        chunks = [e.json() for e in events[:-1]]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    elif dialect == "responses":
        assert last.event == "response.failed"
        names = [e.event for e in events]
        assert "response.completed" not in names
        assert [e.json()["sequence_number"] for e in events] == list(range(len(events)))
        response = last.json()["response"]
        assert response["status"] == "failed"
        assert response["error"] == {"code": "server_error", "message": UNAVAILABLE}
    else:
        assert last.event is None
        assert last.json() == {"error": {"code": 503, "message": UNAVAILABLE, "status": "UNAVAILABLE"}}
        assert all("finishReason" not in e.json()["candidates"][0] for e in events[:-1])


def assert_store_consistent(stack: GatewayStack) -> None:
    """Every request half left in the capture store belongs to a captured call (the failed one's is gone)."""
    database = stack.data_dir / "gateway" / CAPTURE_FILE

    def request_halves_and_calls() -> tuple[set[str], set[str]]:
        with sqlite3.connect(database) as db:
            requests = {row[0] for row in db.execute("SELECT call_id FROM requests")}
            return requests, {row[0] for row in db.execute("SELECT call_id FROM calls")}

    # the request half of an unanswered call is dropped in the background
    wait_until(request_halves_and_calls, 5, what="request halves = captured calls", until=lambda rc: rc[0] == rc[1])


def assert_one_failure_logged(capsys: pytest.CaptureFixture[str]) -> None:
    """One clear log line (written just after the stream ends, so it may lag the client a moment)."""
    output = ""

    def logged() -> bool:
        nonlocal output
        output += capsys.readouterr().out
        return "call failed mid-stream" in output

    wait_until(logged, 5, interval_s=0.02, what="the mid-stream failure logged")
    failures = [line for line in output.splitlines() if "call failed mid-stream" in line]
    assert len(failures) == 1, failures
    assert "status=200" in failures[0], failures
    assert "events_sent=" in failures[0], failures


@pytest.mark.parametrize("dialect", DIALECTS)
def test_failure_mid_stream_ends_the_stream_with_the_dialect_error(
    gateway_stack: GatewayStack, session: OpenedSession, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway_stack.set_script({"select": "sequence", "replies": [{"text": FIRST}, FAILING, {"text": SECOND}]})
    first = stream(gateway_stack, session, dialect, ["hi"])
    assert streamed_text(dialect, first) == FIRST
    turns = ["hi", FIRST, "go on"]
    assert_failed_stream(dialect, stream(gateway_stack, session, dialect, turns))
    assert_one_failure_logged(capsys)
    assert len(gateway_stack.calls(session.session_id)) == 1  # the failed call is not captured
    retry = stream(gateway_stack, session, dialect, turns)  # the harness retries the same request
    assert streamed_text(dialect, retry) == SECOND
    calls = gateway_stack.calls(session.session_id)
    assert [call.sequence for call in calls] == [calls[0].sequence, calls[0].sequence + 1]
    assert [call.completion.content[-1].text.text for call in calls] == [FIRST, SECOND]
    assert_chain_extends(calls)  # the retry continues the last answered call, token for token
    assert_store_consistent(gateway_stack)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.slow
def test_failure_before_the_first_token_is_a_plain_error_response(
    gateway_stack: GatewayStack, session: OpenedSession, dialect: str
) -> None:
    # Every attempt fails ("turn" selection: the gRPC channel retries UNAVAILABLE before any response).
    gateway_stack.set_script({"replies": [{"text": LONG, "fail_after_tokens": 0}]})
    reply = post(gateway_stack.http_base_url, STREAM_PATHS[dialect], body(dialect, ["hi"]), key=session.key)
    status = 529 if dialect == "anthropic" else 503
    assert reply.status == status
    assert error_message(dialect, status, reply.json()) == UNAVAILABLE
    assert gateway_stack.calls(session.session_id) == []
    assert_store_consistent(gateway_stack)


# The official SDKs: each raises instead of returning the partial answer as a result --------------------


def continue_after_sdk_failure(stack: GatewayStack, session: OpenedSession, answer: str) -> None:
    calls = stack.calls(session.session_id)
    assert len(calls) == 1
    assert calls[0].completion.content[-1].text.text == answer
    assert_store_consistent(stack)


SDK_SCRIPT = {"select": "sequence", "replies": [FAILING, {"text": SECOND}]}


def test_anthropic_sdk_raises(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(SDK_SCRIPT)
    client = anthropic.Anthropic(base_url=gateway_stack.http_base_url, api_key=session.key, max_retries=0)
    messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    received: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        client.messages.stream(model="m", max_tokens=200, messages=messages) as events,
    ):
        received.extend(events.text_stream)
    assert received
    assert LONG.startswith("".join(received))
    assert raised.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": UNAVAILABLE}}
    with client.messages.stream(model="m", max_tokens=200, messages=messages) as events:
        assert events.get_final_text() == SECOND
    continue_after_sdk_failure(gateway_stack, session, SECOND)


def test_openai_chat_sdk_raises(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(SDK_SCRIPT)
    client = openai.OpenAI(base_url=gateway_stack.openai_base_url, api_key=session.key, max_retries=0)
    received: list[str] = []
    chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError, match="unavailable") as raised:
        received.extend(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert "".join(received)
    assert LONG.startswith("".join(received))
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["type"] == "server_error"
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == SECOND
    continue_after_sdk_failure(gateway_stack, session, SECOND)


@pytest.mark.slow
def test_openai_responses_sdk_raises(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(SDK_SCRIPT)
    client = openai.OpenAI(base_url=gateway_stack.openai_base_url, api_key=session.key, max_retries=0)
    kinds: list[str] = []
    # The Responses stream helper has no error event to raise on: it yields the typed `response.failed`
    # event, and asking it for the final response raises (there is no `response.completed`).
    with client.responses.stream(model="m", input="hi") as events:
        for event in events:
            kinds.append(event.type)
            if event.type == "response.failed":
                assert event.response.status == "failed"
                assert event.response.error is not None
                assert event.response.error.message == UNAVAILABLE
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            events.get_final_response()
    assert "response.output_text.delta" in kinds
    assert kinds[-1] == "response.failed"
    reply = client.responses.create(model="m", input="hi")
    assert reply.output_text == SECOND
    continue_after_sdk_failure(gateway_stack, session, SECOND)


def test_google_sdk_raises(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(SDK_SCRIPT)
    options = genai_types.HttpOptions(base_url=gateway_stack.http_base_url)
    client = genai.Client(api_key=session.key, http_options=options)
    received: list[str] = []
    chunks = client.models.generate_content_stream(model="m", contents="hi")
    with pytest.raises(genai_errors.ServerError) as raised:
        received.extend(chunk.text or "" for chunk in chunks)
    assert "".join(received)
    assert LONG.startswith("".join(received))
    assert (raised.value.code, raised.value.status, raised.value.message) == (503, "UNAVAILABLE", UNAVAILABLE)
    assert client.models.generate_content(model="m", contents="hi").text == SECOND
    continue_after_sdk_failure(gateway_stack, session, SECOND)
