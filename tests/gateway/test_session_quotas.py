"""Per-session quotas on the vendor-API port (lodestar_gateway/quotas.py): calls, calls at once and request bytes,
each refused with 429 in the caller's dialect before inference or the capture store see the call."""

from __future__ import annotations

import json
import threading

import pytest

from tests.gateway.conftest import StackFactory
from tests.gateway.http import post

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def test_a_session_past_its_calls_is_refused_in_its_dialect(gateway_stack_factory: StackFactory) -> None:
    stack = gateway_stack_factory({"replies": [{"text": "ok"}]}, session_max_calls=2)
    session = stack.open_session()
    for _ in range(2):
        assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status == 200
    refused = post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key)
    assert refused.status == 429
    assert "at most 2 model calls" in refused.json()["error"]["message"]
    anthropic = post(stack.http_base_url, "/v1/messages", MESSAGES, key=session.key)
    assert anthropic.status == 429
    assert anthropic.json()["type"] == "error"
    assert len(stack.calls(session.session_id)) == 2, "nothing of a refused call was captured"
    other = stack.open_session()
    assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=other.key).status == 200, "per session"


@pytest.mark.slow
def test_calls_at_once_are_bounded_and_freed(gateway_stack_factory: StackFactory) -> None:
    stack = gateway_stack_factory({"replies": [{"text": "slow reply here"}], "token_delay_s": 0.2},
                                  session_max_concurrent_calls=1)  # fmt: skip
    session = stack.open_session()
    first: list[int] = []
    slow = threading.Thread(
        target=lambda: first.append(post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status)
    )
    slow.start()
    try:
        for _ in range(50):  # until the first call is in flight
            if stack.node is not None and any(e.usage.in_flight for e in stack.node.sessions._by_id.values()):
                break
            threading.Event().wait(0.02)
        second = post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key)
    finally:
        slow.join(30)
    assert second.status == 429, second.body
    assert "at once" in second.json()["error"]["message"]
    assert first == [200]
    assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status == 200, "freed"


def test_request_bytes_are_bounded(gateway_stack_factory: StackFactory) -> None:
    size = len(json.dumps(CHAT).encode())
    stack = gateway_stack_factory({"replies": [{"text": "ok"}]}, session_max_request_bytes=size * 2 + 10)
    session = stack.open_session()
    assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status == 200
    assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status == 200
    refused = post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key)
    assert refused.status == 429
    assert "request bytes" in refused.json()["error"]["message"]


COUNT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
GOOGLE_COUNT = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def test_token_counts_are_admitted_by_the_quotas(gateway_stack_factory: StackFactory) -> None:
    """count_tokens reaches inference too: a session past its calls (or bytes) cannot loop on it."""
    stack = gateway_stack_factory({"replies": [{"text": "ok"}]}, session_max_calls=2)
    session = stack.open_session()
    for _ in range(2):
        assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=session.key).status == 200
    counted = post(stack.http_base_url, "/v1/messages/count_tokens", COUNT, key=session.key)
    assert counted.status == 429, "a session past its calls still counted tokens"
    assert counted.json()["type"] == "error"
    assert "at most 2 model calls" in counted.json()["error"]["message"]
    google = post(stack.http_base_url, "/v1beta/models/m:countTokens", GOOGLE_COUNT, key=session.key)
    assert google.status == 429
    assert google.json()["error"]["status"] == "RESOURCE_EXHAUSTED"

    fresh = stack.open_session()
    for _ in range(2):
        assert post(stack.http_base_url, "/v1/messages/count_tokens", COUNT, key=fresh.key).status == 200
    assert post(stack.http_base_url, "/v1/chat/completions", CHAT, key=fresh.key).status == 429, "counts are calls"
