"""A session's sampling policy overrides what the client asks for, in every dialect, through the official SDKs,
on a real model (transformers backend, tiny model): the record says what was used and what was asked, and
the captured logprobs are those of the policy's distribution (teacher-forced here), not the client's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
import torch
from google import genai
from google.genai import types
from openai import OpenAI
from transformers import AutoModelForCausalLM

from lodestar.v1 import common_pb2
from lodestar_inference.sampling import processed_logprobs
from tests.gateway.conftest import StackFactory
from tests.gateway.stack import GatewayStack, OpenedSession

POLICY = common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_RUN, temperature=0.5)
"""The run's policy: temperature 0.5, top_p and top_k left at their defaults (1.0, off)."""
ASKED = {"temperature": 0.9, "top_p": 0.3, "top_k": 3}
"""What every client asks for instead (0.9: Anthropic's temperature is at most 1)."""
TOKENS = 12


def _openai_chat(stack: GatewayStack, session: OpenedSession) -> None:
    OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello"}], max_tokens=TOKENS,
        temperature=ASKED["temperature"], top_p=ASKED["top_p"], extra_body={"top_k": ASKED["top_k"]},
    )  # fmt: skip


def _openai_responses(stack: GatewayStack, session: OpenedSession) -> None:
    OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0).responses.create(
        model="tiny", input="Say hello", max_output_tokens=TOKENS, temperature=ASKED["temperature"],
        top_p=ASKED["top_p"], extra_body={"top_k": ASKED["top_k"]},
    )  # fmt: skip


def _anthropic(stack: GatewayStack, session: OpenedSession) -> None:
    anthropic.Anthropic(base_url=stack.http_base_url, api_key=session.key, max_retries=0).messages.create(
        model="tiny", max_tokens=TOKENS, messages=[{"role": "user", "content": "Say hello"}],
        extra_body=ASKED,  # this SDK version dropped the sampling keywords; the API still takes them
    )  # fmt: skip


def _google(stack: GatewayStack, session: OpenedSession) -> None:
    client = genai.Client(api_key=session.key, http_options=types.HttpOptions(base_url=stack.http_base_url))
    config = types.GenerateContentConfig(
        temperature=ASKED["temperature"], top_p=ASKED["top_p"], top_k=ASKED["top_k"], max_output_tokens=TOKENS
    )
    client.models.generate_content(model="tiny", contents="Say hello", config=config)


DIALECTS: dict[str, Callable[[GatewayStack, OpenedSession], None]] = {
    "openai_chat": _openai_chat,
    "openai_responses": _openai_responses,
    "anthropic": _anthropic,
    "google": _google,
}


@pytest.fixture(scope="module")
def teacher(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture
def real_stack(gateway_stack_factory: StackFactory) -> GatewayStack:
    return gateway_stack_factory(backend="transformers")


def _recomputed(
    teacher: Any, call: common_pb2.CallRecord, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """The logprob of each sampled token of `call` under (temperature, top_k, top_p), teacher-forced."""
    ids = [*call.prompt_token_ids, *call.completion_token_ids]
    with torch.no_grad():
        logits = teacher(torch.tensor([ids])).logits[0, len(call.prompt_token_ids) - 1 : -1]
    logprobs = processed_logprobs(logits, temperature, top_k, top_p)
    return logprobs.gather(1, torch.tensor(list(call.completion_token_ids))[:, None])[:, 0]


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_the_sessions_policy_overrides_the_clients_sampling(real_stack: GatewayStack, teacher: Any, dialect: str):
    session = real_stack.open_session(sampling_policy=POLICY, test=dialect)
    DIALECTS[dialect](real_stack, session)

    (call,) = real_stack.calls(session.session_id)
    used, asked = call.sampling, call.requested_sampling
    assert (used.temperature, used.top_p, used.top_k) == (0.5, 1.0, 0)
    assert used.max_tokens == TOKENS, "max_tokens stays the client's"
    assert asked.temperature == pytest.approx(ASKED["temperature"])
    assert asked.top_p == pytest.approx(ASKED["top_p"])
    assert asked.top_k == ASKED["top_k"]
    captured = torch.tensor(list(call.completion_logprobs))
    under_policy = _recomputed(teacher, call, 0.5, 0, 1.0)
    assert (captured - under_policy).abs().max() <= 1e-4, "inference sampled from the policy's distribution"
    under_client = _recomputed(teacher, call, ASKED["temperature"], int(ASKED["top_k"]), ASKED["top_p"])
    assert (captured - under_client).abs().mean() > 1e-2, "the client's distribution is not what was sampled"


def test_the_policy_is_kept_with_the_session_and_resolved(real_stack: GatewayStack) -> None:
    session = real_stack.open_session(sampling_policy=common_pb2.SamplingPolicy(top_k=0), test="kept")
    stored = real_stack.get_session(session.session_id).session.sampling_policy
    assert stored.mode == common_pb2.SAMPLING_MODE_RUN
    assert (stored.temperature, stored.top_p, stored.top_k) == (1.0, 1.0, 0)
    real_stack.restart_gateway()
    _openai_chat(real_stack, session)
    (call,) = real_stack.calls(session.session_id)
    assert (call.sampling.temperature, call.sampling.top_p, call.sampling.top_k) == (1.0, 1.0, 0), (
        "the policy survives a restart of the node"
    )


def test_without_a_policy_calls_sample_as_the_client_asks(real_stack: GatewayStack, teacher: Any) -> None:
    session = real_stack.open_session(test="no-policy")
    _google(real_stack, session)
    (call,) = real_stack.calls(session.session_id)
    assert call.sampling.temperature == pytest.approx(ASKED["temperature"])
    assert call.sampling.top_p == pytest.approx(ASKED["top_p"])
    assert call.sampling.top_k == ASKED["top_k"]
    assert call.requested_sampling == call.sampling
    captured = torch.tensor(list(call.completion_logprobs))
    recomputed = _recomputed(teacher, call, call.sampling.temperature, call.sampling.top_k, call.sampling.top_p)
    assert (captured - recomputed).abs().max() <= 1e-4


def test_a_harness_mode_policy_leaves_sampling_to_the_client(real_stack: GatewayStack) -> None:
    policy = common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_HARNESS, temperature=0.5)
    session = real_stack.open_session(sampling_policy=policy, test="harness-mode")
    _anthropic(real_stack, session)
    (call,) = real_stack.calls(session.session_id)
    assert call.sampling.temperature == pytest.approx(ASKED["temperature"])
    assert call.sampling.top_k == ASKED["top_k"]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (common_pb2.SamplingPolicy(temperature=0.0), "temperature must be > 0"),
        (common_pb2.SamplingPolicy(top_p=1.5), "top_p must be in"),
        (common_pb2.SamplingPolicy(top_k=-2), "top_k must be >= 0"),
    ],
)
def test_an_out_of_range_policy_is_refused(gateway_stack: GatewayStack, policy: Any, message: str) -> None:
    import grpc

    with pytest.raises(grpc.RpcError) as raised:
        gateway_stack.open_session(sampling_policy=policy)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (raised.value.details() or "")
