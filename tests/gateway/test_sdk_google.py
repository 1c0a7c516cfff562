"""The official `google-genai` SDK against a running gateway: generate_content, generate_content_stream,
count_tokens, and a function-calling session (Gemini CLI and Pi shapes: thought parts dropped on re-send,
functionCall ids dropped)."""

from __future__ import annotations

import pytest
from google import genai
from google.genai import errors, types

from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends

SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a shell command",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}},
)
TOOL_SCRIPT = {
    "replies": [
        {"reasoning": "Look first.", "tool_calls": [{"name": "run_shell_command", "arguments": {"command": "ls"}}]},
        {"reasoning": "Now answer.", "text": "Found a and b."},
    ]
}


def client(stack: GatewayStack, session: OpenedSession) -> genai.Client:
    return genai.Client(api_key=session.key, http_options=types.HttpOptions(base_url=stack.http_base_url))


def test_generate_content_and_stream(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"text": "Hello from Gemini land."}]})
    gemini = client(gateway_stack, session)
    reply = gemini.models.generate_content(
        model="gemini-tiny", contents="Hi", config=types.GenerateContentConfig(temperature=0.3, max_output_tokens=50)
    )
    assert reply.text == "Hello from Gemini land."
    assert reply.candidates
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP
    chunks = list(gemini.models.generate_content_stream(model="gemini-tiny", contents="Hi"))
    assert len(chunks) > 2
    assert "".join(chunk.text or "" for chunk in chunks) == "Hello from Gemini land."
    assert chunks[-1].usage_metadata is not None
    assert chunks[-1].usage_metadata.total_token_count
    calls = gateway_stack.calls(session.session_id)
    assert len(calls) == 2
    assert calls[0].sampling.temperature == pytest.approx(0.3)


def test_function_calling_session_chains_without_thoughts(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(TOOL_SCRIPT)
    gemini = client(gateway_stack, session)
    config = types.GenerateContentConfig(
        system_instruction="You are Gemini CLI.",
        tools=[types.Tool(function_declarations=[SHELL])],
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    chunks = list(gemini.models.generate_content_stream(model="gemini-tiny", contents=contents, config=config))
    parts = [part for chunk in chunks if chunk.candidates for part in (chunk.candidates[0].content.parts or [])]
    assert any(part.thought for part in parts)
    (call,) = [part.function_call for part in parts if part.function_call]
    assert call.name == "run_shell_command"
    assert call.args == {"command": "ls"}
    # Gemini CLI re-sends the model turn WITHOUT its thought parts; Pi drops the call id.
    contents.append(
        types.Content(
            role="model",
            parts=[
                types.Part(function_call=types.FunctionCall(name=call.name, args=call.args), thought_signature=b"sig")
            ],
        )
    )
    contents.append(
        types.Content(
            role="user",
            parts=[types.Part(function_response=types.FunctionResponse(name=call.name, response={"output": "a\nb"}))],
        )
    )
    reply = gemini.models.generate_content(model="gemini-tiny", contents=contents, config=config)
    assert reply.text == "Found a and b."
    assert_chain_extends(gateway_stack.calls(session.session_id))


def test_count_tokens_and_errors(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gemini = client(gateway_stack, session)
    assert (gemini.models.count_tokens(model="gemini-tiny", contents="Hello there").total_tokens or 0) > 3
    with pytest.raises(errors.ClientError) as raised:
        gemini.models.generate_content(
            model="gemini-tiny", contents=[types.Content(role="banana", parts=[types.Part(text="hi")])]
        )
    assert raised.value.code == 400
    assert raised.value.status == "INVALID_ARGUMENT"
    assert "contents.0.role" in (raised.value.message or "")
    stranger = genai.Client(api_key="nope", http_options=types.HttpOptions(base_url=gateway_stack.http_base_url))
    with pytest.raises(errors.ClientError) as denied:
        stranger.models.generate_content(model="gemini-tiny", contents="hi")
    assert denied.value.code == 401
