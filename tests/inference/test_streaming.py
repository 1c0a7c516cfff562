"""Coalesced streaming in `Generation.run`: what a client assembles never depends on how tokens were grouped.

A replay engine delivers fixed ids (with distinct logprobs) in step groupings and at times the test
chooses, so the same completion can go through the one-delta-per-token path (one id per engine step,
`flush_s=0`) and through coalesced paths (big engine steps, a long flush interval). The real transformers
engine checks that the first delta is not held back and that a cancelled coalesced stream frees its slot.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.assistant import _partial_suffix
from lodestar_inference.engine import EngineInfo, EngineRequest, EngineStep, SamplingOptions, next_delivery
from lodestar_inference.engines.transformers import TransformersEngine
from lodestar_inference.generation import Generation
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.toolcalls import format_for
from tests.inference.helpers import Collected, sampling, tool, user
from tests.waiting import eventually

BIG_FLUSH_S = 3600.0
"""A flush interval no test reaches: only the first and the last step go out."""


class ReplayEngine:
    """Replays `ids` in steps of the given sizes, pausing `pause_s` before every step after the first.

    `paces=True`: the engine claims `paces_steps` (it replays its steps as they are: the steps stand for
    what a pacing engine delivers), so `Generation` must send each step as a delta without pacing again."""

    def __init__(
        self, ids: Sequence[int], sizes: Sequence[int], eos: int, *, pause_s: float = 0.0, paces: bool = False
    ) -> None:
        self.ids, self.sizes, self.eos, self.pause_s, self.paces = list(ids), list(sizes), eos, pause_s, paces
        self.closed = 0
        self.step_times: list[float] = []
        self.requests: list[EngineRequest] = []

    def info(self) -> EngineInfo:
        return EngineInfo("replay", 65536, 4096, (self.eos,), paces_steps=self.paces)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        self.requests.append(request)
        position = 0
        try:
            for number, size in enumerate(self.sizes):
                if number and self.pause_s:
                    await asyncio.sleep(self.pause_s)
                chunk = self.ids[position : position + size]
                position += size
                done = position >= len(self.ids)
                finish = ("stop" if chunk and chunk[-1] == self.eos else "length") if done else None
                self.step_times.append(time.perf_counter())
                yield EngineStep(tuple(chunk), tuple(-0.5 - (position - size + i) / 7 for i in range(len(chunk))), 3,
                                 finish)  # fmt: skip
                if done:
                    return
        finally:
            self.closed += 1


def generation(engine: object, template: ChatTemplate, flush_s: float) -> Generation:
    fmt = format_for("auto", template.tokenizer.chat_template)
    return Generation(engine, template, fmt, max_new_tokens=4096, flush_s=flush_s)  # type: ignore[arg-type]


def generate_request(stop: Sequence[str] = (), *, stream: bool = True) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        messages=[user("Use the tool.")], tools=[tool("Bash")], stream=stream, sampling=sampling(stop=list(stop))
    )


async def run(gen: Generation, request: inference_pb2.GenerateRequest) -> tuple[Collected, list[float]]:
    out, times = Collected(), []
    async for response in gen.run(request):
        times.append(time.perf_counter())
        kind = response.WhichOneof("event")
        out.events.append(kind)
        (out.deltas if kind == "delta" else out.finals).append(getattr(response, kind))
    return out, times


@dataclass(frozen=True)
class Assembled:
    """What a client builds from the deltas, checked against the final event of the same stream."""

    ids: list[int]
    logprobs: list[float]
    text: str
    reasoning: str
    calls: list[tuple[int, str, str]]
    message: str
    """The final's parsed message without the (random) tool-call ids."""


def assemble(out: Collected) -> Assembled:
    final = out.final
    ids = [t for d in out.deltas for t in d.token_ids]
    logprobs = [lp for d in out.deltas for lp in d.logprobs]
    text = "".join(d.text for d in out.deltas)
    reasoning = "".join(d.reasoning_text for d in out.deltas)
    streamed = [c for d in out.deltas for c in d.tool_calls]
    assert ids == list(final.completion_token_ids)
    assert logprobs == list(final.completion_logprobs)
    assert text == "".join(p.text.text for p in final.message.content if p.HasField("text"))
    assert reasoning == "".join(p.reasoning.text for p in final.message.content if p.HasField("reasoning"))
    assert [(c.id, c.name, c.arguments_delta) for c in streamed] == [
        (c.id, c.name, c.arguments_json) for c in final.message.tool_calls
    ]
    calls = [(c.index, c.name, c.arguments_delta) for c in streamed]
    return Assembled(ids, logprobs, text, reasoning, calls, without_call_ids(final))


def without_call_ids(final: inference_pb2.GenerateFinal) -> str:
    message = common_pb2.ChatMessage()
    message.CopyFrom(final.message)
    for call in message.tool_calls:
        call.id = ""
    return message.SerializeToString(deterministic=True).hex()


CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
PIECES = st.sampled_from(
    ["Hello", " world", "\n", "  ", "é", "日本語", "🙂", "<think>", "</think>", "<tool_call>", "</tool_call>", CALL,
     '{"name": "Bash"', "}", "STOP", "ab", "<|im_end|>"]
)  # fmt: skip


def sizes_for(total: int, cuts: list[int]) -> list[int]:
    """Step sizes that cut `total` ids at the given (sorted, deduplicated) positions."""
    edges = [0, *sorted({cut for cut in cuts if 0 < cut < total}), total]
    return [b - a for a, b in itertools.pairwise(edges)] or [0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(PIECES, min_size=1, max_size=14),
    raw=st.lists(st.integers(3, 4095), max_size=6),
    cuts=st.lists(st.integers(1, 80), max_size=10),
    end=st.booleans(),
)
def test_coalescing_never_changes_what_the_client_assembles(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer, pieces: list[str], raw: list[int], cuts: list[int],
    end: bool,
) -> None:  # fmt: skip
    eos = tiny_tokenizer.eos_token_ids[0]
    ids = tiny_tokenizer.encode("".join(pieces)) + raw + ([eos] if end else [])
    per_token = [1] * len(ids)
    grouped = sizes_for(len(ids), cuts)

    async def main() -> None:
        request = generate_request()
        reference, _ = await run(generation(ReplayEngine(ids, per_token, eos), chat_template, 0.0), request)
        assert len(reference.deltas) == len(ids)
        expected = assemble(reference)
        for sizes, flush_s in ((grouped, 0.0), (per_token, BIG_FLUSH_S), (grouped, BIG_FLUSH_S)):
            coalesced, _ = await run(generation(ReplayEngine(ids, sizes, eos), chat_template, flush_s), request)
            assert assemble(coalesced) == expected
            assert len(coalesced.deltas) <= (len(sizes) if flush_s == 0.0 else 2)
        # An engine that paces its own steps: every step it delivers goes out as one delta, same result.
        paced_engine = ReplayEngine(ids, grouped, eos, paces=True)
        paced, _ = await run(generation(paced_engine, chat_template, BIG_FLUSH_S), request)
        assert assemble(paced) == expected
        assert len(paced.deltas) == len(grouped)
        assert paced_engine.requests[0].hold_s == BIG_FLUSH_S
        final_only, _ = await run(
            generation(ReplayEngine(ids, grouped, eos), chat_template, 0.0), generate_request(stream=False)
        )
        assert final_only.events == ["final"]
        assert without_call_ids(final_only.final) == expected.message
        assert list(final_only.final.completion_token_ids) == ids

    asyncio.run(main())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(PIECES, max_size=8),
    after=st.lists(PIECES, max_size=4),
    stop=st.sampled_from(["STOP", "日本", "ab", "Hello w", "}", "</think>"]),
)
def test_stop_sequences_cut_the_same_with_coalescing(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer, before: list[str], after: list[str], stop: str
) -> None:
    ids = tiny_tokenizer.encode("".join([*before, stop, *after]))

    async def main() -> None:
        request = generate_request([stop])
        results = []
        for flush_s in (0.0, BIG_FLUSH_S):
            out, _ = await run(generation(ReplayEngine(ids, [1] * len(ids), -1), chat_template, flush_s), request)
            assert out.final.finish_reason == common_pb2.FINISH_REASON_STOP_SEQUENCE
            results.append((assemble(out), out.final.matched_stop))
        assert results[0] == results[1]

    asyncio.run(main())


async def test_stop_sequences_are_searched_on_every_step_even_with_a_pacing_engine(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> None:
    ids = tiny_tokenizer.encode("alpha beta STOP gamma delta")
    engine = ReplayEngine(ids, [1] * len(ids), -1, paces=True)
    out, _ = await run(generation(engine, chat_template, BIG_FLUSH_S), generate_request(["STOP"]))
    assert engine.requests[0].hold_s == 0.0  # no pacing in the engine: it would sample past the stop
    assert out.final.finish_reason == common_pb2.FINISH_REASON_STOP_SEQUENCE
    assert len(out.deltas) == 2  # Generation paces instead: the first step, then the stop
    assert "".join(d.text for d in out.deltas) == "alpha beta"


async def test_streams_share_a_message_budget(chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer) -> None:
    """With a budget of 50 deltas/s a lone stream sends every 20 ms (not every 1 ms, its flush interval), a
    stream started beside it every 40 ms; the first and the last delta still go out at once."""
    ids = tiny_tokenizer.encode(" ".join(f"w{i}" for i in range(40)))
    engine = ReplayEngine(ids, [1] * len(ids), -1, pause_s=0.004)
    fmt = format_for("auto", chat_template.tokenizer.chat_template)
    gen = Generation(engine, chat_template, fmt, max_new_tokens=4096, flush_s=0.001, messages_per_s=50.0)
    assert gen.stream_interval() == 0.02
    assert gen.stream_interval(running=3) == 0.08  # what a stream starting beside 3 others would get
    alone = asyncio.create_task(run(gen, generate_request()))
    await eventually(lambda: gen._streams, 5, interval_s=0.002, what="the first stream to start")
    assert gen.stream_interval() == 0.04  # the first stream is still running (40 steps, 4 ms apart)
    beside, beside_times = await run(gen, generate_request())
    first, first_times = await alone
    assert gen._streams == 0
    for out, times, interval in ((first, first_times, 0.02), (beside, beside_times, 0.04)):
        assert [t for d in out.deltas for t in d.token_ids] == ids
        gaps = [b - a for a, b in itertools.pairwise(times[:-2])]  # between deltas, the finishing one aside
        assert gaps
        assert min(gaps) >= 0.9 * interval
    assert len(beside.deltas) < len(first.deltas)


async def test_first_and_last_deltas_are_not_held_back(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> None:
    """The first delta leaves as soon as the first step exists, the last as soon as the engine finishes;
    in between at most one delta per flush interval, each carrying everything sampled since the last."""
    ids = tiny_tokenizer.encode("one two three four five six seven eight nine ten eleven twelve")
    engine = ReplayEngine(ids, [1] * len(ids), -1, pause_s=0.01)
    out, times = await run(generation(engine, chat_template, 0.05), generate_request())
    assert times[0] - engine.step_times[0] < 0.005  # no wait for the flush interval
    assert times[-2] - engine.step_times[-1] < 0.005  # the finishing delta, then the final
    middle = times[1:-2]
    assert all(b - a >= 0.05 for a, b in zip(times[:-2], middle, strict=False))
    assert len(out.deltas) < len(ids) / 2
    assert [t for d in out.deltas for t in d.token_ids] == ids


async def test_real_engine_first_delta_is_one_token_and_cancel_frees_the_slot(
    tiny_model_dir: Path, chat_template: ChatTemplate
) -> None:
    engine = TransformersEngine(tiny_model_dir, device="cpu", dtype="float32", max_batch_size=1)
    await engine.start()
    try:
        gen = generation(engine, chat_template, BIG_FLUSH_S)
        long = gen.run(
            inference_pb2.GenerateRequest(
                messages=[user("Talk a lot.")], stream=True, sampling=sampling(seed=3, max_tokens=60000)
            )
        )
        first = await anext(long)
        assert len(first.delta.token_ids) == 1  # out at once, not after the flush interval
        await asyncio.sleep(0.2)  # the engine keeps sampling; nothing is sent
        await long.aclose()
        await eventually(engine._running, 5, what="no request running", until=lambda running: running == 0)
        # One slot: if the cancelled request still held it, this one would wait for 60,000 tokens.
        short = generation(engine, chat_template, 0.005).run(
            inference_pb2.GenerateRequest(messages=[user("hi")], stream=True, sampling=sampling(seed=4, max_tokens=4))
        )
        events = [response.WhichOneof("event") async for response in short]
        assert events[-1] == "final"
        # A consumer that falls behind gets the waiting steps merged into one, not a backlog.
        steps = engine.generate(EngineRequest("slow", (5, 6, 7), SamplingOptions(max_tokens=12, seed=5)))
        first_step = await anext(steps)
        await asyncio.sleep(0.5)
        rest = [step async for step in steps]
        assert len(first_step.token_ids) == 1
        assert len(rest) < 11
        assert sum(len(step.token_ids) for step in rest) == sum(len(step.logprobs) for step in rest) == 11
        assert rest[-1].finish_reason == "length"
    finally:
        await engine.close()


def test_stream_intervals_are_whole_multiples_of_the_flush_interval(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> None:
    """The budget's interval is rounded up to a multiple of flush_s, so paced streams share due instants."""
    engine = ReplayEngine([1], [1], -1)
    fmt = format_for("auto", chat_template.tokenizer.chat_template)
    gen = Generation(engine, chat_template, fmt, max_new_tokens=4096, flush_s=0.02, messages_per_s=500.0)
    assert gen.stream_interval(running=0) == 0.02  # 1 / 500 s is under flush_s
    assert gen.stream_interval(running=9) == pytest.approx(0.02)  # 10 / 500 = 0.02 exactly, not 0.04
    assert gen.stream_interval(running=15) == pytest.approx(0.04)  # 16 / 500 = 0.032
    assert gen.stream_interval(running=63) == pytest.approx(0.14)  # 64 / 500 = 0.128


@settings(max_examples=500, deadline=None)
@given(delivered=st.floats(0.0, 1e6), hold=st.floats(1e-3, 10.0), other=st.floats(0.0, 1e6))
def test_next_delivery_is_a_shared_instant_about_one_hold_later(delivered: float, hold: float, other: float) -> None:
    due = next_delivery(delivered, hold)
    assert hold / 2 * (1 - 1e-9) <= due - delivered <= 1.5 * hold * (1 + 1e-9) + 1e-6
    assert abs(due / hold - round(due / hold)) < 1e-6  # a multiple of hold: streams at one pace come due together
    later = next_delivery(other, hold)
    assert later == due or abs(later - due) >= hold * (1 - 1e-6)  # never two due instants closer than hold


async def test_the_transformers_engine_paces_a_stream_without_changing_it(tiny_model_dir: Path) -> None:
    """With `hold_s` the engine delivers the first id at once, then what it sampled per interval, the
    finishing step at once; the ids and logprobs are those of the same seeded request unpaced."""
    engine = TransformersEngine(tiny_model_dir, device="cpu", dtype="float32", max_batch_size=4)
    await engine.start()
    try:
        assert engine.info().paces_steps
        options = SamplingOptions(max_tokens=40, seed=11)

        async def steps(hold_s: float) -> list[EngineStep]:
            return [step async for step in engine.generate(EngineRequest(f"paced-{hold_s}", (5, 6, 7), options,
                                                                           hold_s=hold_s))]  # fmt: skip

        # One after the other: alone in the batch, each request's logits are computed the same way.
        unpaced, held, paced = [await steps(hold_s) for hold_s in (0.0, BIG_FLUSH_S, 0.002)]
        ids = [token for step in unpaced for token in step.token_ids]
        logprobs = [value for step in unpaced for value in step.logprobs]
        assert len(unpaced) == len(ids) == 40  # one step per id
        for got in (held, paced):
            assert [token for step in got for token in step.token_ids] == ids
            assert [value for step in got for value in step.logprobs] == logprobs
            assert len(got[0].token_ids) == 1
            assert got[-1].finish_reason == "length"
            assert all(step.finish_reason is None for step in got[:-1])
        assert len(held) == 2  # the first id, then the rest with the finish
        assert 2 <= len(paced) <= len(ids)
    finally:
        await engine.close()


@settings(max_examples=300, deadline=None)
@given(text=st.text("<ab/é", max_size=14), marker=st.text("<ab/é", min_size=1, max_size=7))
def test_partial_suffix_is_the_longest_suffix_that_starts_the_marker(text: str, marker: str) -> None:
    longest = max((size for size in range(1, min(len(marker) - 1, len(text)) + 1) if marker.startswith(text[-size:])),
                  default=0)  # fmt: skip
    assert _partial_suffix(text, marker) == longest
