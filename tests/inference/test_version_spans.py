"""`GenerateFinal.policy_version_spans` from an engine that swaps weights under a running request.

A replay engine stands for one (the vllm engine with `weight_swap = "keep"`; its real test is
test_vllm_no_drain.py): it reports the version that sampled the first token as every step's
`policy_version` and, from the swap on, cumulative `version_spans`. `Generation.run` must put them on the
final message over exactly the ids it returns, whatever the streaming path (one delta per step or
coalesced) and also when a stop sequence ends the call before the engine finishes; a call sampled by one
version has no spans (what every engine that never swaps under a request sends, and old clients expect).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.engine import EngineInfo, EngineRequest, EngineStep, VersionSpan
from lodestar_inference.generation import Generation
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.toolcalls import format_for
from tests.inference.helpers import sampling, user


class SwappingEngine:
    """Replays `ids` one per step; the weights change from `old` to `new` before id `swap_at` (None: never)."""

    def __init__(self, ids: Sequence[int], eos: int, swap_at: int | None, old: int = 3, new: int = 4) -> None:
        self.ids, self.eos, self.swap_at, self.old, self.new = list(ids), eos, swap_at, old, new

    def info(self) -> EngineInfo:
        return EngineInfo("replay", 65536, 4096, (self.eos,))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        for index, token in enumerate(self.ids):
            spans: tuple[VersionSpan, ...] = ()
            if self.swap_at is not None and index >= self.swap_at:
                spans = (VersionSpan(self.old, 0, self.swap_at), VersionSpan(self.new, self.swap_at, index + 1))
            done = index == len(self.ids) - 1
            yield EngineStep((token,), (-0.5,), self.old, "length" if done else None, spans)


def _generation(engine: SwappingEngine, template: ChatTemplate, flush_s: float) -> Generation:
    fmt = format_for("auto", template.tokenizer.chat_template)
    return Generation(engine, template, fmt, max_new_tokens=4096, flush_s=flush_s)  # type: ignore[arg-type]


async def _final(gen: Generation, stop: Sequence[str] = ()) -> inference_pb2.GenerateFinal:
    request = inference_pb2.GenerateRequest(
        messages=[user("Say something.")], stream=True, sampling=sampling(stop=list(stop))
    )
    finals = [response.final async for response in gen.run(request) if response.WhichOneof("event") == "final"]
    assert len(finals) == 1
    return finals[0]


def _spans(final: inference_pb2.GenerateFinal) -> list[tuple[int, int, int]]:
    return [(span.policy_version, span.start, span.end) for span in final.policy_version_spans]


@pytest.mark.parametrize("flush_s", [0.0, 3600.0])
async def test_spans_reach_the_final_over_every_id(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer, flush_s: float
) -> None:
    ids = tiny_tokenizer.encode("one two three four five six seven")
    final = await _final(_generation(SwappingEngine(ids, -1, swap_at=3), chat_template, flush_s))
    assert list(final.completion_token_ids) == ids
    assert final.policy_version == 3  # the first token's version
    assert _spans(final) == [(3, 0, 3), (4, 3, len(ids))]


async def test_a_stop_sequence_keeps_the_spans_of_the_ids_returned(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> None:
    ids = tiny_tokenizer.encode("alpha beta gamma STOP delta epsilon zeta")
    final = await _final(_generation(SwappingEngine(ids, -1, swap_at=2), chat_template, 0.0), ["STOP"])
    assert final.finish_reason == common_pb2.FINISH_REASON_STOP_SEQUENCE
    returned = len(final.completion_token_ids)
    assert 2 < returned < len(ids)
    assert _spans(final) == [(3, 0, 2), (4, 2, returned)]


async def test_one_version_needs_no_spans(chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer) -> None:
    ids = tiny_tokenizer.encode("one two three")
    final = await _final(_generation(SwappingEngine(ids, -1, swap_at=None), chat_template, 0.0))
    assert final.policy_version == 3
    assert _spans(final) == []
    # an engine that reports spans of a single version (a swap to the version it already served) adds none
    final = await _final(_generation(SwappingEngine(ids, -1, swap_at=1, new=3), chat_template, 0.0))
    assert _spans(final) == []
