"""Property tests: random and mutated requests to every endpoint never get a 5xx, every error is in the
dialect's error shape, and the gateway stays healthy.

Mutations start from rich valid requests (system prompts, tools, tool calls and results, reasoning,
images, sampling fields) and delete a field, replace a value with random JSON, or add a random field,
anywhere in the tree. Valid survivors really run (the scripted engine answers with reasoning, text and a
tool call, so every render path is exercised).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.cases import error_message
from tests.gateway.http import post, request
from tests.gateway.stack import GatewayStack, OpenedSession

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
RICH: dict[str, tuple[str, str, dict[str, Any]]] = {
    "anthropic": (
        "anthropic",
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "stop_sequences": ["X"],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: a"}, {"type": "text", "text": "sys"}],
            "thinking": {"type": "enabled", "budget_tokens": 100},
            "metadata": {"user_id": "u"},
            "tools": [{"name": "Bash", "description": "d", "input_schema": SCHEMA}],
            "tool_choice": {"type": "auto"},
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "tu1",
                            "content": [{"type": "text", "text": "a"}],
                            "is_error": False,
                        }
                    ],
                },
                {"role": "system", "content": "reminder"},
            ],
        },
    ),
    "anthropic_count": (
        "anthropic",
        "/v1/messages/count_tokens",
        {
            "model": "m",
            "system": "s",
            "tools": [{"name": "Bash", "input_schema": SCHEMA}],
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    "chat": (
        "chat",
        "/v1/chat/completions",
        {
            "model": "m",
            "max_tokens": 64,
            "temperature": 0.7,
            "top_p": 1,
            "stop": ["X"],
            "seed": 3,
            "n": 1,
            "stream_options": {"include_usage": True},
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "tools": [{"type": "function", "function": {"name": "shell", "description": "d", "parameters": SCHEMA}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "t",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}]},
            ],
        },
    ),
    "responses": (
        "responses",
        "/v1/responses",
        {
            "model": "m",
            "max_output_tokens": 64,
            "temperature": 0.5,
            "store": False,
            "parallel_tool_calls": True,
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "low"},
            "prompt_cache_key": "k",
            "tools": [
                {"type": "function", "name": "shell", "parameters": SCHEMA},
                {
                    "type": "namespace",
                    "name": "ns",
                    "description": "d",
                    "tools": [{"type": "function", "name": "f", "parameters": SCHEMA}],
                },
                {"type": "custom", "name": "apply_patch", "description": "patch"},
                {"type": "web_search"},
            ],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
                {
                    "type": "message",
                    "role": "user",
                    "id": "i1",
                    "content": [
                        {"type": "input_text", "text": "hi"},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
                    ],
                },
                {"type": "reasoning", "id": "rs1", "summary": [{"type": "summary_text", "text": "t"}]},
                {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a"},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
            ],
        },
    ),
    "google": (
        "google",
        "/v1beta/models/m:generateContent",
        {
            "systemInstruction": {"parts": [{"text": "sys"}]},
            "tools": [{"functionDeclarations": [{"name": "run", "description": "d", "parametersJsonSchema": SCHEMA}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            "generationConfig": {
                "temperature": 0.5,
                "topP": 0.9,
                "topK": 10,
                "maxOutputTokens": 64,
                "stopSequences": ["X"],
                "thinkingConfig": {"includeThoughts": True},
            },
            "contents": [
                {"role": "user", "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": PNG}}]},
                {
                    "role": "model",
                    "parts": [
                        {"text": "t", "thought": True},
                        {"functionCall": {"name": "run", "args": {"command": "ls"}}, "thoughtSignature": "c2ln"},
                    ],
                },
                {"role": "user", "parts": [{"functionResponse": {"name": "run", "response": {"output": "a"}}}]},
            ],
        },
    ),
    "google_stream": (
        "google",
        "/v1beta/models/m:streamGenerateContent?alt=sse",
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        },
    ),
    "google_count": (
        "google",
        "/v1/models/m:countTokens",
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        },
    ),
}
SCRIPT = {"replies": [], "default": {"reasoning": "r", "text": "t", "tool_calls": [{"name": "shell", "arguments": {}}]}}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[GatewayStack]:
    with GatewayStack.start(tmp_path_factory.mktemp("fuzz"), tiny_model_dir, script=SCRIPT) as stack:
        yield stack


@pytest.fixture(scope="module")
def fuzz_session(fuzz_stack: GatewayStack) -> OpenedSession:
    return fuzz_stack.open_session(test="fuzz")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, body: dict[str, Any]) -> Any:
    value = copy.deepcopy(body)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        if not path:
            value = draw(json_values) if action == "replace" else value
            continue
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(json_values)
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.text(max_size=8))] = draw(json_values)
        elif isinstance(parent[path[-1]], list):
            parent[path[-1]].append(draw(json_values))
    return value


def _check(stack: GatewayStack, session: OpenedSession, dialect: str, path: str, raw: bytes) -> None:
    reply = post(stack.http_base_url, path, raw=raw, key=session.key)
    assert reply.status < 500, (reply.status, reply.body[:500], raw[:500])
    if reply.status >= 400:
        error_message(dialect, reply.status, json.loads(reply.body))
    elif reply.headers.get("content-type", "").startswith("text/event-stream"):
        assert reply.body.rstrip().endswith((b"[DONE]", b"}")), reply.body[-200:]
        assert b"internal error" not in reply.body
    else:
        assert isinstance(json.loads(reply.body), dict)


def _healthy(stack: GatewayStack) -> None:
    assert request(stack.http_base_url, "GET", "/").status == 200


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("case", list(RICH))
def test_rich_requests_are_valid(fuzz_stack: GatewayStack, fuzz_session: OpenedSession, case: str) -> None:
    _dialect, path, body = RICH[case]
    reply = post(fuzz_stack.http_base_url, path, body, key=fuzz_session.key)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("case", list(RICH))
@FUZZ
@given(data=st.data())
def test_mutated_requests(
    fuzz_stack: GatewayStack, fuzz_session: OpenedSession, case: str, data: st.DataObject
) -> None:
    dialect, path, body = RICH[case]
    value = data.draw(mutated(body))
    if data.draw(st.booleans()) and isinstance(value, dict) and dialect != "google":
        value["stream"] = True
    _check(fuzz_stack, fuzz_session, dialect, path, json.dumps(value).encode())
    _healthy(fuzz_stack)


@pytest.mark.parametrize("case", ["anthropic", "chat", "responses", "google"])
@FUZZ
@given(value=json_values, junk=st.binary(max_size=64))
def test_random_bodies(
    fuzz_stack: GatewayStack, fuzz_session: OpenedSession, case: str, value: Any, junk: bytes
) -> None:
    dialect, path, _ = RICH[case]
    _check(fuzz_stack, fuzz_session, dialect, path, json.dumps(value).encode())
    _check(fuzz_stack, fuzz_session, dialect, path, junk)
    _healthy(fuzz_stack)
