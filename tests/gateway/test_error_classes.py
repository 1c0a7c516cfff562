"""Error classes through the official SDKs: a context overflow in each vendor's own words (what the
harnesses recognise), a bug in inference as a 500 in the dialect's shape that nobody retries, and the
transient class (unavailable inference) as each vendor's retryable status."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.gateway.cases import VALID, error_message
from tests.gateway.conftest import StackFactory
from tests.gateway.http import post
from tests.gateway.stack import GatewayStack, OpenedSession

SMALL_CONTEXT = {"context_length": 48, "replies": [{"text": "fits"}]}
LONG = "please read all of this " * 20


def _clients(stack: GatewayStack, session: OpenedSession) -> tuple[anthropic.Anthropic, openai.OpenAI, genai.Client]:
    return (
        anthropic.Anthropic(base_url=stack.http_base_url, api_key=session.key, max_retries=0),
        openai.OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0),
        genai.Client(
            api_key=session.key,
            http_options=types.HttpOptions(
                base_url=stack.http_base_url, retry_options=types.HttpRetryOptions(attempts=1)
            ),
        ),
    )


def test_context_overflow_in_each_vendors_words(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script(SMALL_CONTEXT)
    claude, oai, gemini = _clients(gateway_stack, session)
    with pytest.raises(anthropic.BadRequestError) as too_long:
        claude.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": LONG}])
    assert too_long.value.status_code == 400
    body = too_long.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "invalid_request_error"
    words = body["error"]["message"].split()  # "prompt is too long: N tokens > M maximum"
    assert words[:4] == ["prompt", "is", "too", "long:"]
    assert int(words[4]) > 48
    assert words[5:] == ["tokens", ">", "48", "maximum"]
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG}])
    assert chat.value.code == "context_length_exceeded"
    assert "maximum context length is 48 tokens" in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        oai.responses.create(model="m", input=LONG, stream=True)
    assert responses.value.code == "context_length_exceeded"
    with pytest.raises(genai_errors.ClientError) as google:
        gemini.models.generate_content(model="m", contents=LONG)
    assert google.value.code == 400
    assert google.value.status == "INVALID_ARGUMENT"
    assert "input token count" in (google.value.message or "")
    # A prompt that fits is served (the same session goes on after an overflow).
    short = claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert short.content[0].type == "text"
    assert short.content[0].text == "fits"
    assert len(gateway_stack.calls(session.session_id)) == 1


@pytest.mark.parametrize("dialect", list(VALID))
@pytest.mark.slow
def test_a_bug_in_inference_is_a_500_that_is_not_retried(gateway_stack_factory: StackFactory, dialect: str) -> None:
    # If anything retried the crashed Generate, the retry would get the second reply and answer 200.
    stack = gateway_stack_factory({"select": "sequence", "replies": [{"crash": True}, {"text": "second"}]})
    session = stack.open_session()
    path, body = VALID[dialect]
    reply = post(stack.http_base_url, path, body, key=session.key)
    assert reply.status == 500, reply.body
    message = error_message(dialect, 500, reply.json())
    assert "internal error" in message
    assert "RuntimeError" not in message
    assert "scripted crash" not in message
    assert post(stack.http_base_url, path, body, key=session.key).status == 200  # the next call is answered
    assert [call.sequence for call in stack.calls(session.session_id)] == [0]


@pytest.mark.slow
def test_sdk_error_types_for_a_bug(gateway_stack: GatewayStack, session: OpenedSession) -> None:
    gateway_stack.set_script({"replies": [{"crash": True}]})
    claude, oai, gemini = _clients(gateway_stack, session)
    with pytest.raises(anthropic.InternalServerError) as anthropic_error:
        claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert anthropic_error.value.status_code == 500
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(genai_errors.ServerError) as google:
        gemini.models.generate_content(model="m", contents="hi")
    assert google.value.status == "INTERNAL"
