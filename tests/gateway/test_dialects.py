"""Each dialect's pure layer, without HTTP: parse (body -> canonical request), render (result -> body),
the stream state machine (deltas -> the vendor's exact event sequence) and error rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lodestar.errors import ContextLengthExceededError, InvalidArgumentError, UnavailableError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import dialects
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects.base import DialectAdapter, Route
from lodestar_gateway.errors import InternalError

ANTHROPIC, CHAT = dialects.AnthropicMessages(), dialects.OpenAIChat()
RESPONSES, GOOGLE = dialects.OpenAIResponses(), dialects.GoogleGenerateContent()
TOOL = {"name": "bash", "description": "run", "schema": {"type": "object", "properties": {"c": {"type": "string"}}}}
BODIES: dict[str, tuple[DialectAdapter, Route, dict[str, Any]]] = {
    "anthropic": (ANTHROPIC, Route(), {
        "model": "m", "max_tokens": 64, "temperature": 0.5, "top_k": 5, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"}, {"type": "text", "text": "sys"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "x"}}]}],
        "tools": [{"name": "bash", "description": "run", "input_schema": TOOL["schema"]}], "stream": True,
        "brand_new_field": 1,
    }),
    "chat": (CHAT, Route(), {
        "model": "m", "max_completion_tokens": 64, "max_tokens": 9, "temperature": 0.5, "top_k": 5, "stop": "END",
        "seed": -1, "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "tools": [
            {"type": "function", "function": {"name": "bash", "description": "run", "parameters": TOOL["schema"]}}
        ],
        "stream": True, "brand_new_field": 1,
    }),
    "responses": (RESPONSES, Route(), {
        "model": "m", "max_output_tokens": 64, "temperature": 0.5, "top_k": 5, "instructions": "sys", "input": "hi",
        "tools": [{"type": "function", "name": "bash", "description": "run", "parameters": TOOL["schema"]}],
        "stream": True, "brand_new_field": 1,
    }),
    "google": (GOOGLE, Route(model="m", stream=True), {
        "systemInstruction": {"parts": [{"text": "sys"}]}, "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generation_config": {"maxOutputTokens": 64, "temperature": 0.5, "topK": 5, "stopSequences": ["END"]},
        "tools": [
            {"functionDeclarations": [{"name": "bash", "description": "run", "parametersJsonSchema": TOOL["schema"]}]}
        ],
        "brand_new_field": 1,
    }),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BODIES))
def test_parse_to_canonical(name: str) -> None:
    adapter, route, body = BODIES[name]
    request = adapter.parse(json.loads(json.dumps(body)), route)
    roles = [common_pb2.Role.Name(m.role) for m in request.messages]
    assert roles == ["ROLE_SYSTEM", "ROLE_USER"]
    assert request.messages[0].content[0].text.text == "sys"  # Claude Code's billing line is dropped
    assert [tool.name for tool in request.tools] == ["bash"]
    assert json.loads(request.tools[0].parameters_json) == TOOL["schema"]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_k) == (64, 0.5, 5)
    assert list(sampling.stop) == ([] if name == "responses" else ["END"])
    assert request.stream
    assert request.unknown_fields == ["brand_new_field"]


def test_parse_errors_name_the_field() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^max_tokens: field required"):
        ANTHROPIC.parse({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, Route())
    with pytest.raises(InvalidArgumentError, match=r"^temperature: must be <= 2"):
        CHAT.parse({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, Route())
    with pytest.raises(InvalidArgumentError, match=r"^generationConfig.topK: expected an integer"):
        GOOGLE.parse({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topK": "a"}}, Route(model="m"))


def _result(request: CanonicalRequest, *, tool_call: bool = False) -> CallResult:
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
    message.content.add(text=common_pb2.TextPart(text="Hello"))
    if tool_call:
        message.tool_calls.add(id="call_1", name="bash", arguments_json='{"c": "ls"}')
    finish = common_pb2.FINISH_REASON_TOOL_CALLS if tool_call else common_pb2.FINISH_REASON_STOP
    final = inference_pb2.GenerateFinal(
        prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], completion_logprobs=[-0.1, -0.2],
        finish_reason=finish, message=message, usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=2),
    )  # fmt: skip
    return CallResult(final, message, "resp_1", 1700000000, 0)


def _text_of(name: str, body: dict[str, Any]) -> str:
    if name == "anthropic":
        return "".join(block["text"] for block in body["content"] if block["type"] == "text")
    if name == "chat":
        return str(body["choices"][0]["message"]["content"])
    if name == "responses":
        return "".join(c["text"] for item in body["output"] if item["type"] == "message" for c in item["content"])
    return "".join(part.get("text", "") for part in body["candidates"][0]["content"]["parts"])


@pytest.mark.parametrize("name", list(BODIES))
def test_render_non_streaming(name: str) -> None:
    adapter, route, body = BODIES[name]
    request = adapter.parse({**body, "stream": False} if name != "google" else body, route)
    rendered = adapter.render(request, _result(request, tool_call=True))
    assert _text_of(name, rendered) == "Hello"
    dumped = json.dumps(rendered)
    assert '"bash"' in dumped
    assert "ls" in dumped


def _events(data: bytes) -> list[tuple[str, Any]]:
    """(event name or "", decoded data) per SSE frame ("[DONE]" stays a string)."""
    out: list[tuple[str, Any]] = []
    for frame in data.decode().split("\n\n"):
        if not frame.strip():
            continue
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        payload = fields.get("data", "")
        out.append((fields.get("event", ""), payload if payload == "[DONE]" else json.loads(payload)))
    return out


EXPECTED_STREAMS = {
    "anthropic": ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                  "content_block_stop", "message_delta", "message_stop"],
    "responses": ["response.created", "response.in_progress", "response.output_item.added",
                  "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                  "response.output_text.done", "response.content_part.done", "response.output_item.done",
                  "response.completed"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(BODIES))
def test_stream_state_machine(name: str) -> None:
    adapter, route, body = BODIES[name]
    request = adapter.parse(body, route)
    renderer = adapter.stream(request)
    out = renderer.start("resp_1", 1700000000)
    for text in ("Hel", "lo"):
        out += renderer.delta(inference_pb2.GenerateDelta(token_ids=[4], logprobs=[-0.1], text=text))
    out += renderer.finish(_result(request))
    events = _events(out)
    if name in EXPECTED_STREAMS:
        assert [event for event, _ in events] == EXPECTED_STREAMS[name]
        streamed = "".join(
            d.get("delta", {}).get("text", "") if name == "anthropic" else d.get("delta", "")
            for _, d in events
            if isinstance(d, dict) and d.get("type") in ("content_block_delta", "response.output_text.delta")
        )
        assert streamed == "Hello"
    elif name == "chat":
        assert events[-1][1] == "[DONE]"
        chunks = [d for _, d in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello"
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    else:
        chunks = [d for _, d in events]
        texts = ["".join(p.get("text", "") for p in c["candidates"][0]["content"]["parts"]) for c in chunks]
        assert "".join(texts) == "Hello"
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert "usageMetadata" in chunks[-1]


@pytest.mark.parametrize("name", list(BODIES))
def test_error_shapes_and_statuses(name: str) -> None:
    adapter = BODIES[name][0]
    status, body = adapter.error(ContextLengthExceededError(70000, 65536))
    assert status == 400
    text = json.dumps(body)
    assert "70000" in text
    assert "65536" in text
    assert adapter.error(InternalError("internal error in the gateway"))[0] == 500
    assert adapter.error(UnavailableError("down"))[0] == (529 if name == "anthropic" else 503)
    stream = adapter.stream(adapter.parse(BODIES[name][2], BODIES[name][1]))
    assert b"down" in stream.error(UnavailableError("down"))
