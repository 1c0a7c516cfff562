"""Tool shapes that only some harnesses use: Codex's namespace groups and custom (free-form) tools on the
Responses API, Anthropic `tool_choice`/`redacted_thinking`, Google snake_case fields and JSON-array streams."""

from __future__ import annotations

import json

from tests.gateway.http import post, sse
from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
CODEX_TOOLS = [
    {
        "type": "namespace",
        "name": "mcp_fs",
        "description": "files",
        "tools": [{"type": "function", "name": "list_dir", "parameters": SCHEMA}],
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": {"type": "text"}},
    {"type": "web_search"},
]


def test_codex_namespace_and_custom_tools_round_trip(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(
        {
            "replies": [
                {"tool_calls": [{"name": "mcp_fs.list_dir", "arguments": {"path": "/"}}]},
                {"tool_calls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}]},
                {"text": "Patched."},
            ]
        }
    )
    base, key = gateway_stack.http_base_url, session.key
    items: list[dict[str, object]] = [{"role": "user", "content": "fix it"}]
    first = post(base, "/v1/responses", {"model": "m", "input": items, "tools": CODEX_TOOLS}, key=key).json()
    (call,) = first["output"]
    assert call["type"] == "function_call"
    assert call["namespace"] == "mcp_fs"
    assert call["name"] == "list_dir"
    assert json.loads(call["arguments"]) == {"path": "/"}
    items += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}]
    events = list(
        sse(base, "/v1/responses", {"model": "m", "input": items, "tools": CODEX_TOOLS, "stream": True}, key=key)
    )
    names = [event.event for event in events]
    assert "response.custom_tool_call_input.done" in names
    patch = events[-1].json()["response"]["output"][0]
    assert patch["type"] == "custom_tool_call"
    assert patch["name"] == "apply_patch"
    assert patch["input"] == "*** Begin Patch"
    items += [patch, {"type": "custom_tool_call_output", "call_id": patch["call_id"], "output": "done"}]
    last = post(base, "/v1/responses", {"model": "m", "input": items, "tools": CODEX_TOOLS}, key=key).json()
    assert last["output"][0]["content"][0]["text"] == "Patched."
    calls = gateway_stack.calls(session.session_id)
    assert [tool.name for tool in calls[0].tools] == ["mcp_fs.list_dir", "apply_patch"]  # web_search dropped
    assert_chain_extends(calls)


def test_anthropic_tool_choice_and_redacted_thinking(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    body = {
        "model": "m",
        "max_tokens": 20,
        "tool_choice": {"type": "tool", "name": "ls"},
        "tools": [{"name": "ls", "input_schema": SCHEMA}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "hello"}],
            },
            {"role": "user", "content": "again"},
        ],
    }
    reply = post(gateway_stack.http_base_url, "/v1/messages", body, key=session.key)
    assert reply.status == 200, reply.body
    (call,) = gateway_stack.calls(session.session_id)
    assert call.messages[1].content[0].reasoning.redacted


def test_google_snake_case_and_json_array_stream(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "array stream"}]})
    body = {
        "system_instruction": {"parts": [{"text": "sys"}]},
        "generation_config": {"max_output_tokens": 30, "top_k": 5},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
    }
    reply = post(gateway_stack.http_base_url, "/v1beta/models/m:streamGenerateContent", body, key=session.key)
    assert reply.status == 200
    chunks = json.loads(reply.body)
    assert isinstance(chunks, list)
    assert "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]) == "array stream"
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    (call,) = gateway_stack.calls(session.session_id)
    assert call.sampling.max_tokens == 30
    assert call.sampling.top_k == 5
    assert call.messages[0].content[0].text.text == "sys"
