"""The official `anthropic` SDK against a running gateway: messages.create, messages.stream(),
count_tokens, a multi-turn tool session, Claude Code's billing header and mid-conversation system turn."""

from __future__ import annotations

import anthropic
import pytest

from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends

BASH_TOOL = {
    "name": "Bash",
    "description": "Run a bash command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
TOOL_SCRIPT = {
    "replies": [
        {"reasoning": "Let me look.", "tool_calls": [{"name": ["shell", "Bash"], "arguments": {"command": "ls -la"}}]},
        {"text": "Two files."},
    ]
}


def client(stack: GatewayStack, session: OpenedSession) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.http_base_url, api_key=session.key, max_retries=0)


def test_messages_create_text(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"reasoning": "Easy.", "text": "Hello!"}]})
    message = client(gateway_stack, session).messages.create(
        model="claude-tiny", max_tokens=100, system="You are terse.", messages=[{"role": "user", "content": "Hi"}]
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[1].text == "Hello!"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0
    assert message.usage.output_tokens > 0
    (call,) = gateway_stack.calls(session.session_id)
    assert call.messages[0].content[0].text.text == "You are terse."


def test_messages_stream_tool_session(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(TOOL_SCRIPT)
    claude = client(gateway_stack, session)
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=abc123;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    messages: list[dict[str, object]] = [
        {"role": "user", "content": [{"type": "text", "text": "List files", "cache_control": {"type": "ephemeral"}}]}
    ]
    with claude.messages.stream(
        model="claude-tiny",
        max_tokens=32000,
        system=system,
        messages=messages,
        tools=[BASH_TOOL],
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        events = [event.type for event in stream]
        first = stream.get_final_message()
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert first.stop_reason == "tool_use"
    thinking, tool_use = first.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Let me look."
    assert tool_use.type == "tool_use"
    assert tool_use.name == "Bash"
    assert tool_use.input == {"command": "ls -la"}
    # Next turn: a new billing line, the cache marker moved, Claude Code's mid-conversation system reminder.
    system[0]["text"] = "x-anthropic-billing-header: cc_version=2.1.3; cch=def456;"
    messages[0] = {"role": "user", "content": [{"type": "text", "text": "List files"}]}
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use.id,
                    "content": "a\nb",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
        {"role": "system", "content": "<system-reminder>Be brief.</system-reminder>"},
    ]
    second = claude.messages.create(
        model="claude-tiny",
        max_tokens=32000,
        system=system,
        messages=messages,
        tools=[BASH_TOOL],
        metadata={"user_id": "u"},
        timeout=60,
    )
    assert second.content[-1].text == "Two files."  # type: ignore[union-attr]
    calls = gateway_stack.calls(session.session_id)
    assert_chain_extends(calls)
    assert all("billing" not in m.content[0].text.text for c in calls for m in c.messages if m.content)


def test_count_tokens(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    count = client(gateway_stack, session).messages.count_tokens(
        model="claude-tiny", messages=[{"role": "user", "content": "Hello there"}], tools=[BASH_TOOL]
    )
    assert count.input_tokens > 5


def test_errors_in_anthropic_shape(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    claude = client(gateway_stack, session)
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="m", max_tokens=10, messages=[])
    assert bad.value.body["type"] == "error"  # type: ignore[index]
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages" in bad.value.message
    stranger = anthropic.Anthropic(base_url=gateway_stack.http_base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
