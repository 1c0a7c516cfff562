"""GenerateMany against the real servers (transformers, and vLLM where installed): many generations over
one stream give exactly what separate Generate calls give, in fewer messages; errors, deadlines and
cancellation are per tag; the gateway's client (`GenerateStreams`) rebuilds the same domain errors.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from lodestar.errors import ContextLengthExceededError, DeadlineExceededError
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_gateway.inference_client import GenerateStreams
from tests.inference.conftest import SERVER_CAP, ServerProcess
from tests.inference.helpers import Collected, channel, collect, generation_cancelled, sampling, tool, user


@pytest.fixture
async def stub(backend_server: ServerProcess) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with channel(backend_server.address) as ch:
        yield inference_pb2_grpc.InferenceServiceStub(ch)


def _requests() -> list[inference_pb2.GenerateRequest]:
    """Seeded requests of every kind: streamed and not, with and without tools, greedy and sampled."""
    out = []
    for i in range(12):
        out.append(
            inference_pb2.GenerateRequest(
                request_id=f"many-{i}",
                messages=[user(f"Tell me about item {i}.")],
                tools=[tool("Bash")] if i % 3 == 0 else [],
                stream=i % 4 != 1,
                sampling=sampling(seed=100 + i, max_tokens=24 + 3 * i, temperature=0.0 if i % 5 == 0 else 1.0),
            )
        )
    return out


async def _many(
    stub: inference_pb2_grpc.InferenceServiceStub, requests: list[tuple[int, inference_pb2.GenerateManyRequest]]
) -> tuple[dict[int, list[inference_pb2.TaggedGenerateResponse]], int]:
    """Send `requests` (delay_ms, request) on one GenerateMany stream; returns each tag's responses and the
    number of messages they came in. The stream is half-closed once every tag has ended."""
    open_tags = {r.tag for _, r in requests if r.WhichOneof("action") == "generate"}
    done = asyncio.Event()

    async def outgoing() -> AsyncIterator[inference_pb2.GenerateManyRequest]:
        for delay_ms, r in requests:
            await asyncio.sleep(delay_ms / 1e3)
            yield r
        await done.wait()

    by_tag: dict[int, list[inference_pb2.TaggedGenerateResponse]] = defaultdict(list)
    messages = 0
    call = stub.GenerateMany(outgoing(), timeout=120)
    async for batch in call:
        messages += 1
        for r in batch.responses:
            by_tag[r.tag].append(r)
            if r.HasField("error") or r.response.HasField("final"):
                open_tags.discard(r.tag)
        if not open_tags:
            done.set()
    return by_tag, messages


def _collected(responses: list[inference_pb2.TaggedGenerateResponse]) -> Collected:
    out = Collected()
    for r in responses:
        assert r.HasField("response"), r
        kind = r.response.WhichOneof("event")
        out.events.append(kind)
        (out.deltas.append(r.response.delta) if kind == "delta" else out.finals.append(r.response.final))
    return out


def _assert_same_generation(got: Collected, alone: Collected, request: inference_pb2.GenerateRequest) -> None:
    """`got` is what the separate call gave (the logprobs up to batch numerics: a batch of twelve is
    not a batch of one) and its deltas add up to its final."""
    assert got.events[-1] == "final"
    assert got.events.count("final") == 1
    assert (got.deltas != []) == request.stream  # non-streamed: the final only
    final, expected = got.final, alone.final
    assert list(final.prompt_token_ids) == list(expected.prompt_token_ids)
    assert list(final.completion_token_ids) == list(expected.completion_token_ids)
    assert list(final.completion_logprobs) == pytest.approx(list(expected.completion_logprobs), abs=1e-4)
    assert final.message == expected.message
    assert (final.finish_reason, final.usage) == (expected.finish_reason, expected.usage)
    if request.stream:
        assert [i for d in got.deltas for i in d.token_ids] == list(final.completion_token_ids)
        assert [p for d in got.deltas for p in d.logprobs] == list(final.completion_logprobs)
        text = "".join(p.text.text for p in final.message.content if p.WhichOneof("part") == "text")
        assert "".join(d.text for d in got.deltas) == text
        assert len([c for d in got.deltas for c in d.tool_calls]) >= len(final.message.tool_calls)


async def test_many_generations_on_one_stream_equal_separate_calls(stub) -> None:
    requests = _requests()
    alone = [await collect(stub, r) for r in requests]
    many = [(0, inference_pb2.GenerateManyRequest(tag=10 + i, generate=r)) for i, r in enumerate(requests)]
    by_tag, messages = await _many(stub, many)
    responses = 0
    for i, r in enumerate(requests):
        _assert_same_generation(_collected(by_tag[10 + i]), alone[i], r)
        responses += len(by_tag[10 + i])
    # Twelve generations decoded together: each message carries the responses of several of them.
    assert messages < responses, (messages, responses)


async def test_an_error_ends_only_its_tag(stub) -> None:
    too_long = inference_pb2.GenerateRequest(messages=[user(" x" * 70000)], sampling=sampling(max_tokens=4))
    fine = inference_pb2.GenerateRequest(
        messages=[user("Hello.")], stream=True, sampling=sampling(seed=1, max_tokens=8)
    )
    by_tag, _ = await _many(
        stub,
        [
            (0, inference_pb2.GenerateManyRequest(tag=1, generate=fine)),
            (0, inference_pb2.GenerateManyRequest(tag=2, generate=too_long)),
            (0, inference_pb2.GenerateManyRequest(tag=3)),  # neither generate nor cancel
        ],
    )
    (error,) = [r.error for r in by_tag[2]]
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "65536" in error.message
    assert error.details["lodestar-error-reason"] == "context_length_exceeded"
    assert error.details["lodestar-context-length"] == "65536"
    assert [r.error.code for r in by_tag[3]] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]
    assert _collected(by_tag[1]).final.usage.completion_tokens >= 1


async def test_cancel_stops_the_tag_and_frees_its_slot(stub, backend_server: ServerProcess) -> None:
    talk = inference_pb2.GenerateRequest(
        request_id="many-cancel-me", messages=[user("Talk a lot.")], stream=True,
        sampling=sampling(seed=9, max_tokens=SERVER_CAP),
    )  # fmt: skip
    short = inference_pb2.GenerateRequest(messages=[user("Hi.")], stream=True, sampling=sampling(seed=2, max_tokens=6))
    cancelled = asyncio.Event()
    responses: dict[int, list[inference_pb2.TaggedGenerateResponse]] = defaultdict(list)

    async def outgoing() -> AsyncIterator[inference_pb2.GenerateManyRequest]:
        yield inference_pb2.GenerateManyRequest(tag=7, generate=talk)
        await cancelled.wait()
        yield inference_pb2.GenerateManyRequest(tag=7, cancel=True)
        yield inference_pb2.GenerateManyRequest(tag=8, generate=short)

    call = stub.GenerateMany(outgoing(), timeout=120)
    async for batch in call:
        for r in batch.responses:
            responses[r.tag].append(r)
            if r.tag == 7 and not cancelled.is_set():
                cancelled.set()
        if any(r.tag == 8 and r.response.HasField("final") for r in batch.responses):
            break
    call.cancel()
    assert _collected(responses[8]).final.usage.completion_tokens >= 1
    assert not any(r.response.HasField("final") for r in responses[7])  # nothing more after the cancel
    ended = await generation_cancelled(backend_server.log, "many-cancel-me")
    assert ended[0]["completion_tokens"] < SERVER_CAP


async def test_deadline_ends_the_tag(stub) -> None:
    slow = inference_pb2.GenerateRequest(messages=[user("Talk.")], sampling=sampling(seed=3, max_tokens=SERVER_CAP))
    by_tag, _ = await _many(stub, [(0, inference_pb2.GenerateManyRequest(tag=1, generate=slow, timeout_s=0.05))])
    assert [r.error.code for r in by_tag[1]] == [grpc.StatusCode.DEADLINE_EXCEEDED.value[0]]


async def test_gateway_client_rebuilds_results_and_errors(stub, backend_server: ServerProcess) -> None:
    async with channel(backend_server.address) as ch:
        streams = GenerateStreams(inference_pb2_grpc.InferenceServiceStub(ch))
        try:
            requests = _requests()[:6]

            async def run(r: inference_pb2.GenerateRequest) -> Collected:
                out = Collected()
                async for response in streams.generate(r, timeout_s=60):
                    kind = response.WhichOneof("event")
                    out.events.append(kind)
                    (out.deltas.append(response.delta) if kind == "delta" else out.finals.append(response.final))
                return out

            got = await asyncio.gather(*(run(r) for r in requests))
            for r, g in zip(requests, got, strict=True):
                _assert_same_generation(g, await collect(stub, r), r)
            too_long = inference_pb2.GenerateRequest(messages=[user(" x" * 70000)], sampling=sampling(max_tokens=4))
            with pytest.raises(ContextLengthExceededError) as caught:
                await run(too_long)
            assert caught.value.context_length == 65536
            slow = inference_pb2.GenerateRequest(messages=[user("Talk.")], sampling=sampling(max_tokens=SERVER_CAP))
            with pytest.raises(DeadlineExceededError):
                async for _ in streams.generate(slow, timeout_s=0.05):
                    pass
            assert len((await run(requests[0])).finals) == 1  # the stream still serves
        finally:
            streams.close()
