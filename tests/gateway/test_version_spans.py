"""Capture keeps `GenerateFinal.policy_version_spans`: the CallRecord says which version sampled which tokens.

The stack's inference is the scripted engine, which never swaps weights under a call; the test puts spans
on its final message on the way to the proxy, as the vllm engine's no-drain swap does (its real test:
tests/inference/test_vllm_no_drain.py), and reads the durable records back: with spans and without.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from lodestar.v1 import inference_pb2
from tests.gateway.http import post
from tests.gateway.stack import GatewayStack, OpenedSession


def _swap_under(stack: GatewayStack, at: int) -> None:
    """From now on, every final says the weights went from its version to the next at sampled token `at`."""
    node = stack.node
    assert node is not None
    inner = node.proxy._inference

    class Swapped:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        async def generate(self, request: Any) -> AsyncIterator[inference_pb2.GenerateResponse]:
            async for event in inner.generate(request):
                if event.WhichOneof("event") == "final":
                    final, count = event.final, len(event.final.completion_token_ids)
                    assert at < count
                    final.policy_version_spans.add(policy_version=final.policy_version, start=0, end=at)
                    final.policy_version_spans.add(policy_version=final.policy_version + 1, start=at, end=count)
                yield event

    node.proxy._inference = Swapped()  # type: ignore[assignment]


def test_the_call_record_keeps_the_version_of_each_token_range(
    gateway_stack: GatewayStack, session: OpenedSession
) -> None:
    gateway_stack.set_script({"replies": [{"text": "one two three four five six"}, {"text": "seven eight"}]})
    base, key = gateway_stack.http_base_url, session.key
    body = {"model": "m", "messages": [{"role": "user", "content": "count"}]}
    assert post(base, "/v1/chat/completions", body, key=key).status == 200
    _swap_under(gateway_stack, 2)
    body = {"model": "m", "messages": [{"role": "user", "content": "go on"}], "stream": True}
    assert post(base, "/v1/chat/completions", body, key=key).status == 200
    first, second = gateway_stack.calls(session.session_id)
    assert not first.policy_version_spans  # one version: no spans
    version, count = second.policy_version, len(second.completion_token_ids)
    spans = [(span.policy_version, span.start, span.end) for span in second.policy_version_spans]
    assert spans == [(version, 0, 2), (version + 1, 2, count)]
