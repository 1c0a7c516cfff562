"""The official `openai` SDK against a running gateway: Chat Completions and Responses, plain and streamed
(including the SDK's stream helpers, which validate the event sequence)."""

from __future__ import annotations

import json

import pytest
from openai import AuthenticationError, OpenAI

from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends

SHELL_TOOL_CHAT = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
SHELL_TOOL_RESPONSES = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command",
    "parameters": SHELL_TOOL_CHAT["function"]["parameters"],
}
TOOL_SCRIPT = {
    "replies": [
        {"reasoning": "I should list the files.", "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]},
        {"reasoning": "The listing is in.", "text": "There are two files."},
    ]
}


def client(stack: GatewayStack, session: OpenedSession) -> OpenAI:
    return OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0)


def test_chat_completion_text(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "Hello, world."}]})
    reply = client(gateway_stack, session).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello"}], max_tokens=64, temperature=0.5
    )
    assert reply.choices[0].message.content == "Hello, world."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    (call,) = gateway_stack.calls(session.session_id)
    assert call.completion.content[0].text.text == "Hello, world."
    assert len(call.completion_token_ids) == reply.usage.completion_tokens
    assert call.sampling.max_tokens == 64
    assert call.continued_from_sequence == -1


def test_chat_stream_tool_session_extends_token_by_token(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(TOOL_SCRIPT)
    openai = client(gateway_stack, session)
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is here?"}]
    with openai.chat.completions.stream(
        model="tiny", messages=messages, tools=[SHELL_TOOL_CHAT], stream_options={"include_usage": True}
    ) as stream:
        for _ in stream:
            pass
        first = stream.get_final_completion()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tool_call,) = choice.message.tool_calls or []
    assert tool_call.function.name == "shell"
    assert json.loads(tool_call.function.arguments) == {"command": "ls"}
    assert first.usage is not None
    # The harness re-serializes the arguments compactly and answers with content parts (Qwen Code does).
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should list the files.",
            "tool_calls": [
                {"id": tool_call.id, "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": [{"type": "text", "text": "a b"}]})
    chunks = list(openai.chat.completions.create(model="tiny", messages=messages, tools=[SHELL_TOOL_CHAT], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "There are two files."
    assert chunks[-1].choices[0].finish_reason == "stop"
    calls = gateway_stack.calls(session.session_id)
    assert [c.sequence for c in calls] == [0, 1]
    assert_chain_extends(calls)


def test_responses_text_and_stream_helper(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"reasoning": "Think.", "text": "Hi!"}]})
    openai = client(gateway_stack, session)
    reply = openai.responses.create(model="tiny", input="hello", include=["reasoning.encrypted_content"])
    assert reply.output_text == "Hi!"
    assert reply.status == "completed"
    kinds = [item.type for item in reply.output]
    assert kinds == ["reasoning", "message"]
    with openai.responses.stream(model="tiny", input=[{"role": "user", "content": "hello"}]) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Hi!" == final.output_text


def test_responses_tool_session_round_trips_encrypted_reasoning(
    gateway_stack: GatewayStack, session: OpenedSession
) -> None:
    gateway_stack.set_script(TOOL_SCRIPT)
    openai = client(gateway_stack, session)
    items: list[dict[str, object]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is here?"}],
            "id": "client-item-1",
        },
    ]
    with openai.responses.stream(
        model="tiny", input=items, tools=[SHELL_TOOL_RESPONSES], include=["reasoning.encrypted_content"], store=False
    ) as stream:
        for _ in stream:
            pass
        first = stream.get_final_response()
    reasoning, call = first.output
    assert reasoning.type == "reasoning"
    assert reasoning.encrypted_content
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {"command": "ls"}
    items += [
        {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content},
        {
            "type": "function_call",
            "id": call.id,
            "call_id": call.call_id,
            "name": "shell",
            "arguments": '{"command":"ls"}',
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b"},
    ]
    second = openai.responses.create(model="tiny", input=items, tools=[SHELL_TOOL_RESPONSES], stream=False)
    assert second.output_text == "There are two files."
    assert_chain_extends(gateway_stack.calls(session.session_id))


def test_unknown_key_is_401_in_openai_shape(gateway_stack: GatewayStack) -> None:
    openai = OpenAI(base_url=gateway_stack.openai_base_url, api_key="not-a-session", max_retries=0)
    with pytest.raises(AuthenticationError) as raised:
        openai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 401
    assert "session key" in str(raised.value.message)
