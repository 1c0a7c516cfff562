"""The backend suite: the same tests against a real `lodestar inference serve` of each real engine.

Streaming, logprob equality with a teacher-forced forward pass, limits, stop sequences, continuation,
tool-call parsing (on weights trained here to emit a call), weight updates good and bad, in-flight
requests' tokens carrying the version that sampled them, and cancellation. Weight-changing tests run last
and restore the original weights.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lodestar.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import TextTokenizer
from tests.inference.conftest import SERVER_CAP, ServerProcess
from tests.inference.helpers import (
    channel,
    collect,
    generation_cancelled,
    push_weights,
    sampling,
    system,
    teacher_logprobs,
    tool,
    train_to_answer,
    user,
    weight_stream,
)

pytestmark = pytest.mark.timeout(600)

TOOL_PROMPT = [system("You are a coding agent."), user("List the files.")]
BAD_TOOL_PROMPT = [user("Break the tool call.")]
GOOD_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": \n</tool_call>'


@pytest.fixture
async def stub(backend_server: ServerProcess) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with channel(backend_server.address) as ch:
        yield inference_pb2_grpc.InferenceServiceStub(ch)


@pytest.fixture(scope="session")
def original_weights(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(tiny_model_dir / "model.safetensors"))


@pytest.fixture(scope="session")
def teacher(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def trained_weights(
    tiny_model_dir: Path, chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> dict[str, torch.Tensor]:
    """Weights that answer TOOL_PROMPT with a well-formed call and BAD_TOOL_PROMPT with a broken one."""
    eos = tiny_tokenizer.eos_token_ids[0]
    pairs = [
        (chat_template.prompt(TOOL_PROMPT, [tool("Bash")]).ids, [*tiny_tokenizer.encode(GOOD_CALL), eos]),
        (chat_template.prompt(BAD_TOOL_PROMPT, [tool("Bash")]).ids, [*tiny_tokenizer.encode(BAD_CALL), eos]),
    ]
    return train_to_answer(tiny_model_dir, pairs)


def request(messages, **kwargs) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(messages=messages, **kwargs)


async def test_model_info(stub, backend_server: ServerProcess, tiny_tokenizer: TextTokenizer) -> None:
    info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
    assert info.backend == backend_server.backend
    assert info.context_length == 65536
    assert info.max_new_tokens == SERVER_CAP
    assert info.vocab_size == 4096
    assert tiny_tokenizer.token_id("<|im_end|>") in info.eos_token_ids
    assert info.tool_call_format == "hermes"
    assert info.model_name
    assert info.serving_dtype == "float32", "on CPU both engines serve fp32 (the trainer pushes in it)"


async def test_streaming_deltas_then_exactly_one_final(stub, chat_template: ChatTemplate) -> None:
    messages = [system("Be brief."), user("Say something.")]
    out = await collect(stub, request(messages, sampling=sampling(temperature=1.0, seed=7, max_tokens=12), stream=True))
    assert out.events[-1] == "final"
    assert out.events.count("final") == 1
    assert len(out.deltas) >= 1
    final = out.final
    assert list(final.prompt_token_ids) == list(chat_template.prompt(messages).ids)
    assert [t for d in out.deltas for t in d.token_ids] == list(final.completion_token_ids)
    assert [lp for d in out.deltas for lp in d.logprobs] == pytest.approx(list(final.completion_logprobs))
    assert len(final.completion_logprobs) == len(final.completion_token_ids) == final.usage.completion_tokens
    assert final.usage.prompt_tokens == len(final.prompt_token_ids)
    text = "".join(p.text.text for p in final.message.content if p.WhichOneof("part") == "text")
    reasoning = "".join(p.reasoning.text for p in final.message.content if p.WhichOneof("part") == "reasoning")
    assert "".join(d.text for d in out.deltas) == text
    assert "".join(d.reasoning_text for d in out.deltas) == reasoning
    assert final.message.role == common_pb2.ROLE_ASSISTANT
    assert final.request_id


async def test_non_streaming_sends_only_the_final(stub) -> None:
    out = await collect(stub, request([user("hi")], sampling=sampling(seed=1, max_tokens=5), stream=False))
    assert out.events == ["final"]
    assert 1 <= len(out.final.completion_token_ids) <= 5


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 50, 0.9), (0.0, 0, 1.0), (0.0, 5, 0.5), (1.3, 20, 0.8)],
)
async def test_logprobs_equal_teacher_forcing(stub, teacher, temperature: float, top_k: int, top_p: float) -> None:
    params = sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=11, max_tokens=24)
    final = (await collect(stub, request([user("Write a function.")], sampling=params))).final
    expected = teacher_logprobs(
        teacher, final.prompt_token_ids, final.completion_token_ids, temperature=temperature, top_k=top_k, top_p=top_p
    )
    got = torch.tensor(list(final.completion_logprobs))
    assert torch.isfinite(expected).all()
    assert (expected - got).abs().max().item() < 1e-4


async def test_concurrent_requests_are_each_exact(stub, teacher) -> None:
    params = [sampling(temperature=1.0, seed=seed, max_tokens=8 + seed) for seed in range(8)]
    prompts = [[user(f"Question number {i}: " + "why? " * i)] for i in range(8)]
    outs = await asyncio.gather(
        *(
            collect(stub, request(m, sampling=p, stream=True, request_id="same-id"))
            for m, p in zip(prompts, params, strict=True)
        )
    )
    for out in outs:
        final = out.final
        expected = teacher_logprobs(
            teacher, final.prompt_token_ids, final.completion_token_ids, temperature=1.0, top_k=0, top_p=1.0
        )
        assert (expected - torch.tensor(list(final.completion_logprobs))).abs().max().item() < 1e-4


async def test_long_seeded_prompt(stub, teacher) -> None:
    """Harness prompts are thousands of tokens (longer than one prefill chunk) and may carry a seed."""
    text = "class Handler(Base):\n    value = compute(item, 3)\n" * 400
    params = sampling(temperature=1.0, seed=17, max_tokens=6)
    final = (await collect(stub, request([user(text)], sampling=params))).final
    assert len(final.prompt_token_ids) > 4096
    expected = teacher_logprobs(
        teacher, final.prompt_token_ids, final.completion_token_ids, temperature=1.0, top_k=0, top_p=1.0
    )
    assert (expected - torch.tensor(list(final.completion_logprobs))).abs().max().item() < 1e-4


async def test_same_seed_same_tokens(stub) -> None:
    make = lambda: request([user("Repeat after me.")], sampling=sampling(temperature=1.0, seed=1234, max_tokens=16))  # noqa: E731
    first, second = (await collect(stub, make())).final, (await collect(stub, make())).final
    assert list(first.completion_token_ids) == list(second.completion_token_ids)


async def test_server_caps_new_tokens(stub) -> None:
    final = (await collect(stub, request([user("Go on forever.")], sampling=sampling(seed=3, max_tokens=64000)))).final
    assert len(final.completion_token_ids) <= SERVER_CAP
    if final.finish_reason == common_pb2.FINISH_REASON_LENGTH:
        assert len(final.completion_token_ids) == SERVER_CAP


async def test_prompt_over_context_is_invalid_argument_with_numbers(stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(stub, request([user(" x" * 70000)], sampling=sampling(max_tokens=4)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "65536" in caught.value.details()
    assert any(word.isdigit() and int(word) > 65536 for word in caught.value.details().split())
    metadata = dict(caught.value.trailing_metadata() or ())  # the numbers, for the gateway's vendor wording
    assert metadata["lodestar-error-reason"] == "context_length_exceeded"
    assert metadata["lodestar-context-length"] == "65536"


async def test_continuation_ids_outside_the_vocabulary_are_invalid_argument(stub) -> None:
    """Found before the engine (which would fail on them, and that would read as "generation failed")."""
    info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
    first_messages = [user("First question.")]
    first = (await collect(stub, request(first_messages, sampling=sampling(max_tokens=3)))).final
    tokens = [*first.prompt_token_ids, *first.completion_token_ids]
    tokens[2] = info.vocab_size + 7
    cont = inference_pb2.Continuation(token_ids=tokens, message_count=2)
    messages = [*first_messages, first.message, user("Second question.")]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(stub, request(messages, continuation=cont, sampling=sampling(max_tokens=2)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"continuation.token_ids[2] = {info.vocab_size + 7}" in (caught.value.details() or "")


async def test_bad_sampling_is_invalid_argument(stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(stub, request([user("hi")], sampling=sampling(top_p=1.5)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_model_name_is_served(stub) -> None:
    final = (await collect(stub, request([user("hi")], model="gpt-9-ultra", sampling=sampling(max_tokens=3)))).final
    assert len(final.completion_token_ids) >= 1


async def test_stop_sequence_ends_generation(stub, tiny_tokenizer: TextTokenizer) -> None:
    greedy = sampling(temperature=0.0, max_tokens=32)
    first = (await collect(stub, request([user("Tell me a story.")], sampling=greedy))).final
    raw = tiny_tokenizer.decode(first.completion_token_ids)
    assert len(raw) > 12, raw
    stop = raw[8:12]
    second = (
        await collect(
            stub, request([user("Tell me a story.")], sampling=sampling(temperature=0.0, max_tokens=32, stop=[stop]))
        )
    ).final
    assert second.finish_reason == common_pb2.FINISH_REASON_STOP_SEQUENCE
    assert second.matched_stop == stop
    n = len(second.completion_token_ids)
    assert n < len(first.completion_token_ids)
    assert list(second.completion_token_ids) == list(first.completion_token_ids)[:n]
    assert all(stop not in part.text.text for part in second.message.content)


async def test_continuation_extends_previous_tokens(stub, chat_template: ChatTemplate) -> None:
    first_messages = [system("sys"), user("First question.")]
    first = (await collect(stub, request(first_messages, sampling=sampling(seed=5, max_tokens=10)))).final
    messages = [*first_messages, first.message, user("Second question.")]
    tokens = [*first.prompt_token_ids, *first.completion_token_ids]
    cont = inference_pb2.Continuation(token_ids=tokens, message_count=3)
    second = (await collect(stub, request(messages, continuation=cont, sampling=sampling(seed=6, max_tokens=4)))).final
    assert second.continuation_used
    assert list(second.prompt_token_ids[: len(tokens)]) == tokens
    assert second.usage.continued_prompt_tokens == len(tokens)
    assert list(second.prompt_token_ids) == list(chat_template.prompt(messages, continuation=cont).ids)
    stale = inference_pb2.Continuation(token_ids=tokens, message_count=7)
    third = (await collect(stub, request(messages, continuation=stale, sampling=sampling(max_tokens=2)))).final
    assert not third.continuation_used
    assert list(third.prompt_token_ids) == list(chat_template.prompt(messages).ids)


async def test_cancellation_stops_generation(stub, backend_server: ServerProcess) -> None:
    call = stub.Generate(
        request(
            [user("Talk a lot.")], request_id="cancel-me", sampling=sampling(seed=9, max_tokens=SERVER_CAP), stream=True
        )
    )
    seen = 0
    async for _ in call:
        seen += 1
        if seen == 2:
            break
    call.cancel()
    ended = await generation_cancelled(backend_server.log, "cancel-me")
    assert ended[0]["completion_tokens"] < SERVER_CAP
    after = (await collect(stub, request([user("still there?")], sampling=sampling(max_tokens=3)))).final
    assert len(after.completion_token_ids) >= 1


# -- weights (these change the served model; each restores the original weights) ---------------------


async def _restore(stub, original_weights) -> None:
    await push_weights(stub, original_weights)


async def test_weight_update_then_tool_calls_parse(stub, trained_weights, original_weights) -> None:
    before = (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version.version
    try:
        reply = await push_weights(stub, trained_weights)
        assert reply.policy_version == before + 1
        assert reply.tensors_updated == len(trained_weights)
        info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
        assert info.policy_version.version == before + 1
        greedy = sampling(temperature=0.0, max_tokens=64)
        out = await collect(stub, request(TOOL_PROMPT, tools=[tool("Bash")], sampling=greedy, stream=True))
        final = out.final
        assert final.policy_version == before + 1
        assert final.finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
        assert not final.tool_call_parse_error
        (call,) = final.message.tool_calls
        assert call.name == "Bash"
        assert json.loads(call.arguments_json) == {"command": "ls -la"}
        streamed = [c for d in out.deltas for c in d.tool_calls]
        assert [(c.index, c.id, c.name, json.loads(c.arguments_delta)) for c in streamed] == [
            (0, call.id, "Bash", {"command": "ls -la"})
        ]
        bad = (await collect(stub, request(BAD_TOOL_PROMPT, tools=[tool("Bash")], sampling=greedy))).final
        assert bad.tool_call_parse_error
        assert not bad.message.tool_calls
        assert bad.finish_reason == common_pb2.FINISH_REASON_STOP
        assert "<tool_call>" in "".join(p.text.text for p in bad.message.content)
    finally:
        await _restore(stub, original_weights)


async def test_bad_weight_updates_are_refused_and_old_weights_serve(stub, original_weights) -> None:
    greedy = request([user("Same answer please.")], sampling=sampling(temperature=0.0, max_tokens=12))
    before = (await collect(stub, greedy)).final
    version = (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version.version
    from tests.inference.helpers import safetensors_bytes

    bad_shape = {"lm_head.weight": torch.zeros(10, 64)}
    unknown = {"model.layers.0.not_a_weight": torch.zeros(4)}
    payloads = {
        "shape": safetensors_bytes(bad_shape),
        "name": safetensors_bytes(unknown),
        "garbage": b"\x00" * 64,
    }
    for what, payload in payloads.items():

        async def requests(payload=payload):
            for item in weight_stream(payload):
                yield item

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateWeights(requests(), timeout=60)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what

    good = safetensors_bytes(original_weights)

    async def truncated():
        for item in weight_stream(good[: len(good) // 2], total=len(good)):
            yield item

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.UpdateWeights(truncated(), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.UpdateWeights(
            _one(inference_pb2.UpdateWeightsRequest(checkpoint_path="/nonexistent/ckpt")), timeout=60
        )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED  # outside --checkpoint-dirs
    assert (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version.version == version
    after = (await collect(stub, greedy)).final
    assert list(after.completion_token_ids) == list(before.completion_token_ids)


async def _one(item):
    yield item


async def test_checkpoint_path_update(stub, tiny_model_dir: Path, original_weights) -> None:
    version = (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version.version
    reply = await stub.UpdateWeights(
        _one(inference_pb2.UpdateWeightsRequest(checkpoint_path=str(tiny_model_dir))), timeout=120
    )
    assert reply.policy_version == version + 1
    assert reply.tensors_updated == len(original_weights)


async def test_in_flight_request_tokens_carry_their_version(
    stub, teacher, tiny_model_dir: Path, trained_weights, original_weights
) -> None:
    """Weights swapped under a streaming request: every token's logprob is that of the version it is recorded
    under. transformers keeps the request on its old weights (no spans); vllm swaps under it (default
    `weight_swap = "keep"`): the final's spans name where the new version took over, unless the request
    finished before the swap."""
    version = (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version.version
    call = stub.Generate(
        request([user("A long answer.")], sampling=sampling(temperature=1.0, seed=21, max_tokens=200), stream=True)
    )
    final = None
    update = None
    try:
        async for response in call:
            if update is None:
                update = asyncio.ensure_future(push_weights(stub, trained_weights))
            if response.WhichOneof("event") == "final":
                final = response.final
        reply = await update
        assert final is not None
        assert final.policy_version == version
        ids = final.completion_token_ids
        swap = len(ids)
        if final.policy_version_spans:
            first, second = final.policy_version_spans
            assert (first.policy_version, first.start, second.policy_version, second.end) == (
                version,
                0,
                version + 1,
                len(ids),
            )
            swap = first.end
            assert second.start == swap
            assert 0 < swap < len(ids)
            trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
            trained.load_state_dict(trained_weights, strict=False)
            expected = teacher_logprobs(trained, final.prompt_token_ids, ids, temperature=1.0, top_k=0, top_p=1.0)
            got = torch.tensor(list(final.completion_logprobs))
            assert (expected[swap:] - got[swap:]).abs().max().item() < 1e-4
        expected = teacher_logprobs(teacher, final.prompt_token_ids, ids, temperature=1.0, top_k=0, top_p=1.0)
        got = torch.tensor(list(final.completion_logprobs))
        assert (expected[:swap] - got[:swap]).abs().max().item() < 1e-4
        assert reply.policy_version == version + 1
        fresh = (await collect(stub, request([user("hi")], sampling=sampling(max_tokens=2)))).final
        assert fresh.policy_version == version + 1
        assert not fresh.policy_version_spans
    finally:
        await _restore(stub, original_weights)
