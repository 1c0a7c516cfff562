"""One Generate call from canonical request to streamed deltas and exactly one final event.

`Generation.run(request)` validates sampling parameters, renders the prompt (token-faithful
continuation included) with `ChatTemplate`, enforces the context length and the server's new-token cap,
drives the engine, decodes incrementally, applies stop sequences, parses reasoning and tool calls as they
complete, and builds the `GenerateFinal` (prompt ids, sampled ids, logprobs, finish reason, parsed
message, usage, policy version and, when the weights were swapped under the call, the version of each
token range). Closing the returned iterator (client cancellation) closes the engine
stream, which frees the engine slot.

Streams are coalesced: the first engine step goes out as a delta at once (time to first token); after
it, a stream sends at most one delta per `flush_s` (the `stream_flush_ms` setting), carrying every id,
logprob, text and tool call that accumulated since its last delta, and the last step (finish or stop
sequence) at once. While the client (or gRPC flow control) is not ready for the next message the engine
keeps sampling and the next delta simply carries more. Decoding, stop-sequence holdback and the
reasoning/tool-call parser run once per delta, not once per token. Per-token work remains only where a
token must be looked at: with stop sequences every engine step is decoded and searched, so generation
stops right after the sequence appears. A caller that asked for the final event only (no stream, no stop
sequences) asks the engine for its last step only (`EngineRequest.final_only`) and decodes once.
`flush_s = 0` sends one delta per engine step (the per-token path the coalescing tests compare against).

What a streamed token costs is mostly per gRPC message (server CPU and as much in the client, whatever the
message carries: docs/benchmarks.md), so two more things keep messages and wake-ups few:
- a message budget (`messages_per_s`, the `stream_messages_per_s` setting): a stream starting while n-1
  others run flushes every n / messages_per_s seconds rounded up to a whole multiple of flush_s, so all
  streams together send at most about that many deltas per second however many there are;
- an engine that can pace a stream itself (`EngineInfo.paces_steps`: vLLM, transformers) gets the interval as
  `EngineRequest.hold_s` and delivers a step only when it is due (first and finishing steps at once), so
  this loop runs once per delta instead of once per engine step; each step it gets is sent. Due instants
  are multiples of the interval on one clock (`engine.next_delivery`), shared by all paced streams, so the
  deltas of many streams leave at the same engine step and GenerateMany sends them as one message. Not
  with stop sequences: their steps are searched one by one here, as above.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

from lodestar.chat_json import tool_schema
from lodestar.errors import ContextLengthExceededError, InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.policy_versions import spans_of
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.assistant import AssistantDelta, AssistantParser, ParsedAssistant, _partial_suffix
from lodestar_inference.engine import Engine, EngineRequest, SamplingOptions, VersionSpan
from lodestar_inference.templates import ChatTemplate, Prompt
from lodestar_inference.tokenizer import IncrementalDecoder
from lodestar_inference.toolcalls import ToolCallFormat

_log = get_logger("inference.generate")
INLINE_RENDER_BYTES = 8192
"""Requests up to this size (serialized) are rendered on the event loop: a 60-character chat renders and
tokenizes in ~26 us, a 40K-character one in ~0.6 ms; a worker thread costs a hand-off each way and, on a
busy loop, waits for the GIL (the 5 ms switch interval) before and after."""


def sampling_options(params: common_pb2.SamplingParams, cap: int, room: int) -> SamplingOptions:
    """Resolve a request's sampling parameters (defaults, validation, the server cap and the room left)."""
    temperature = params.temperature if params.HasField("temperature") else 1.0
    top_p = params.top_p if params.HasField("top_p") else 1.0
    top_k = params.top_k if params.HasField("top_k") else 0
    if not temperature >= 0.0:
        raise InvalidArgumentError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise InvalidArgumentError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise InvalidArgumentError(f"top_k must be >= 0, got {top_k}")
    if params.HasField("max_tokens") and params.max_tokens == 0:
        raise InvalidArgumentError("max_tokens must be at least 1")
    requested = params.max_tokens if params.HasField("max_tokens") else cap
    seed = params.seed if params.HasField("seed") else None
    return SamplingOptions(
        max_tokens=max(1, min(requested, cap, room)), temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
    )


def stream_interval(flush_s: float, messages_per_s: float, running: int) -> float:
    """The flush interval of a stream starting while `running` others run: `flush_s`, longer when the streams
    would together send more than `messages_per_s` deltas per second at it (0 stays 0: one delta per step). A
    whole multiple of `flush_s`, so that the due instants of streams at different intervals coincide
    (`engine.next_delivery`)."""
    if flush_s <= 0 or messages_per_s <= 0:
        return flush_s
    flushes = round((running + 1) / messages_per_s / flush_s, 9)  # 10 / 500 / 0.02 is 1.0000000000000002
    return math.ceil(flushes) * flush_s


@dataclass
class _Stops:
    """Stop sequences over the raw decoded completion text."""

    stops: tuple[str, ...]
    matched: str = ""
    cut: int = -1

    def check(self, text: str, searched_from: int) -> bool:
        if not self.stops:
            return False
        longest = max(len(stop) for stop in self.stops)
        start = max(0, searched_from - longest)
        hits = [(text.find(stop, start), stop) for stop in self.stops]
        hits = [(index, stop) for index, stop in hits if index >= 0]
        if hits:
            self.cut, self.matched = min(hits)
        return bool(hits)

    def holdback(self, text: str) -> int:
        return max((_partial_suffix(text, stop) for stop in self.stops), default=0)


@dataclass
class _CallIds:
    ids: list[str] = field(default_factory=list)

    def get(self, index: int) -> str:
        while len(self.ids) <= index:
            self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return self.ids[index]


class Generation:
    """Runs Generate calls against one engine with one chat template."""

    def __init__(
        self,
        engine: Engine,
        template: ChatTemplate,
        fmt: ToolCallFormat,
        *,
        max_new_tokens: int,
        flush_s: float = 0.02,
        messages_per_s: float = 0.0,
    ) -> None:
        self._engine = engine
        self._template = template
        self._fmt = fmt
        self._cap = max_new_tokens
        self._flush_s = flush_s
        self._messages_per_s = messages_per_s
        self._streams = 0
        """Streaming calls running now (they share the message budget)."""
        self.replica_id = ""
        """This replica's name, reported in every final (`GenerateFinal.served_by`); set once the server binds."""

    def stream_interval(self, running: int | None = None) -> float:
        """The flush interval of a stream starting while `running` others run (default: the streams running
        now): see `stream_interval`."""
        return stream_interval(self._flush_s, self._messages_per_s, self._streams if running is None else running)

    async def run(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        started = time.perf_counter()
        call = await self._plan(request)
        out = self._output(request, call)
        stream, stops, flush_s, paced = call.stream, call.stops, call.flush_s, call.paced
        version: int | None = None
        spans: tuple[VersionSpan, ...] = ()
        engine_finish: str | None = None
        first_token_s: float | None = None
        last_sent = -math.inf
        steps = self._engine.generate(call.engine_request)
        self._streams += int(stream)
        try:
            async for step in steps:
                now = time.perf_counter()
                if first_token_s is None:
                    first_token_s, version = now - started, step.policy_version
                out.ids += step.token_ids
                out.logprobs += step.logprobs
                spans = step.version_spans or spans
                engine_finish = step.finish_reason
                stopped = bool(stops.stops) and out.check_stops(final=engine_finish is not None)
                done = stopped or engine_finish is not None
                if stream and (done or paced or now - last_sent >= flush_s):
                    yield out.delta(done)
                    last_sent = now
                if stopped:
                    break
        except BaseException as error:  # client gone (CancelledError / GeneratorExit) or engine failure
            _log.info(
                "generate cancelled",
                request_id=call.request_id,
                completion_tokens=len(out.ids),
                reason=type(error).__name__,
            )
            raise
        finally:
            self._streams -= int(stream)
            if isinstance(steps, AsyncGenerator):  # the engine frees the request's slot on close
                await steps.aclose()
        final = self._final(call, out, engine_finish, version, spans)
        _log_generated(call, final, first_token_s, started)
        yield inference_pb2.GenerateResponse(final=final)

    async def _plan(self, request: inference_pb2.GenerateRequest) -> _Call:
        """Render the prompt, check it fits, resolve sampling and stops, and choose how the stream is paced."""
        request_id = request.request_id or f"gen-{secrets.token_hex(8)}"  # (a uuid4 costs 4x as much)
        info = self._engine.info()
        prompt = await self._render(request, info.vocab_size)
        context = info.context_length
        if len(prompt.ids) >= context:
            raise ContextLengthExceededError(len(prompt.ids), context)
        options = sampling_options(request.sampling, self._cap, context - len(prompt.ids))
        stops = _Stops(tuple(stop for stop in request.sampling.stop if stop))
        stream = request.stream
        flush_s = self.stream_interval() if stream else 0.0
        # The engine paces the steps itself when it can (the consumer is not woken for a step it would not
        # send); not with stop sequences, where every step is searched so that generation stops right away.
        paced = info.paces_steps and flush_s > 0 and not stops.stops
        engine_request = EngineRequest(  # engine ids stay unique even when a client reuses its request_id
            f"{request_id}#{secrets.token_hex(4)}",
            prompt.ids,
            options,
            messages=tuple(request.messages),
            tools=tuple(request.tools),
            final_only=not stream and not stops.stops,
            hold_s=flush_s if paced else 0.0,
        )
        return _Call(request_id, prompt, stops, stream, flush_s, paced, engine_request)

    async def _render(self, request: inference_pb2.GenerateRequest, vocab_size: int) -> Prompt:
        """The prompt of `request`, rendered on the event loop when small, in a worker thread when large."""
        continuation = request.continuation if request.HasField("continuation") else None
        thinking = request.enable_thinking if request.HasField("enable_thinking") else None
        if request.ByteSize() <= INLINE_RENDER_BYTES:  # tens of microseconds: less than the thread hop costs
            return self._prompt(request, thinking, continuation, vocab_size)
        # rendering and tokenizing a long harness prompt takes milliseconds: keep the event loop free
        return await asyncio.to_thread(self._prompt, request, thinking, continuation, vocab_size)

    def _prompt(
        self,
        request: inference_pb2.GenerateRequest,
        thinking: bool | None,
        continuation: inference_pb2.Continuation | None,
        vocab_size: int,
    ) -> Prompt:
        if continuation is not None:
            check_token_ids(continuation.token_ids, vocab_size, "continuation.token_ids")
        return self._template.prompt(
            request.messages, request.tools, enable_thinking=thinking, continuation=continuation
        )

    def _output(self, request: inference_pb2.GenerateRequest, call: _Call) -> _Output:
        """An empty output with its decoder and the reasoning/tool-call parser the request asks for."""
        schemas = {tool.name: tool_schema(tool) for tool in request.tools}
        parser = AssistantParser(
            self._fmt,
            schemas,
            starts_in_reasoning=call.prompt.opens_reasoning,
            parse_tool_calls=request.tool_choice.mode != common_pb2.TOOL_CHOICE_MODE_NONE,
        )
        return _Output(IncrementalDecoder(self._template.tokenizer), parser, call.stops)

    def _final(
        self,
        call: _Call,
        out: _Output,
        engine_finish: str | None,
        version: int | None,
        spans: Sequence[VersionSpan] = (),
    ) -> inference_pb2.GenerateFinal:
        """The final event: everything sampled, the parsed message, the finish reason and usage."""
        prompt, stops, parser = call.prompt, call.stops, out.parser
        out.decode(final=True)
        parser.update(out.completion_text(), final=True)
        parsed = parser.result
        ids, logprobs = out.ids, out.logprobs
        return inference_pb2.GenerateFinal(
            prompt_token_ids=prompt.ids,
            completion_token_ids=ids,
            completion_logprobs=logprobs,
            finish_reason=_finish_reason(engine_finish, stops.cut >= 0, parsed),
            message=_message(parsed, out.call_ids),
            usage=common_pb2.Usage(
                prompt_tokens=len(prompt.ids),
                completion_tokens=len(ids),
                continued_prompt_tokens=prompt.continued_tokens,
            ),
            policy_version=version or 0,
            continuation_used=prompt.continuation_used,
            tool_call_parse_error=parsed.parse_error,
            matched_stop=stops.matched,
            request_id=call.request_id,
            served_by=self.replica_id,
            policy_version_spans=_version_spans(spans, len(ids)),
        )


@dataclass(frozen=True)
class _Call:
    """One Generate call as planned before the engine starts (`Generation._plan`)."""

    request_id: str
    prompt: Prompt
    stops: _Stops
    stream: bool
    flush_s: float
    """The stream's flush interval (0: not streamed, or one delta per engine step)."""
    paced: bool
    """The engine delivers a step only when it is due (`EngineRequest.hold_s`): each step is sent."""
    engine_request: EngineRequest


def _log_generated(
    call: _Call, final: inference_pb2.GenerateFinal, first_token_s: float | None, started: float
) -> None:
    """The call's canonical log line."""
    _log.info(
        "generate",
        request_id=call.request_id,
        prompt_tokens=len(call.prompt.ids),
        completion_tokens=len(final.completion_token_ids),
        continued_tokens=call.prompt.continued_tokens,
        finish=common_pb2.FinishReason.Name(final.finish_reason),
        policy_version=final.policy_version,
        first_token_ms=round((first_token_s or 0.0) * 1e3, 2),
        duration_ms=round((time.perf_counter() - started) * 1e3, 2),
    )


@dataclass
class _Output:
    """What one generation produced so far, and how much of it the client has been sent."""

    decoder: IncrementalDecoder
    parser: AssistantParser
    stops: _Stops
    call_ids: _CallIds = field(default_factory=lambda: _CallIds())
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    decoded: int = 0
    """Ids handed to the decoder."""
    sent: int = 0
    """Ids (and logprobs) already sent in deltas."""

    def decode(self, *, final: bool) -> None:
        """Hand the ids not decoded yet to the decoder (at the end: flush what is left)."""
        if self.decoded < len(self.ids):
            self.decoder.add(self.ids[self.decoded :])
            self.decoded = len(self.ids)
        if final:
            self.decoder.flush()

    def check_stops(self, *, final: bool) -> bool:
        """Decode the new ids and search them for a stop sequence; True once one matched."""
        before = len(self.decoder.text)
        self.decode(final=final)
        return self.stops.check(self.decoder.text, before)

    def completion_text(self) -> str:
        """The completion text the message is parsed from: cut before a matched stop sequence."""
        text = self.decoder.text
        return text[: self.stops.cut] if self.stops.cut >= 0 else text

    def delta(self, done: bool) -> inference_pb2.GenerateResponse:
        """A delta with everything since the previous one; `done`: the last (settles all held-back text)."""
        self.decode(final=done)
        if done:
            update = self.parser.update(self.completion_text(), final=True)
        else:
            text = self.decoder.text
            update = self.parser.update(text[: len(text) - self.stops.holdback(text)])
        response = _delta(self.ids[self.sent :], self.logprobs[self.sent :], update, self.call_ids)
        self.sent = len(self.ids)
        return response


def _version_spans(spans: Sequence[VersionSpan], count: int) -> list[common_pb2.PolicyVersionSpan]:
    """The final's `policy_version_spans`: the engine's spans over the call's `count` ids, none when one
    version sampled them all. Ids past the engine's last span (none expected) keep its version."""
    if not spans:
        return []
    versions = [span.version for span in spans for _ in range(span.start, span.end)][:count]
    versions += [spans[-1].version] * (count - len(versions))
    return spans_of(versions)


def check_token_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    """Token ids a client sent must exist in the model's vocabulary (else the engine would fail on them)."""
    if ids and max(ids) >= vocab_size:
        position, bad = next((i, t) for i, t in enumerate(ids) if t >= vocab_size)
        raise InvalidArgumentError(
            f"{what}[{position}] = {bad} is not a token id of this model (vocabulary size {vocab_size})"
        )


def _delta(
    token_ids: list[int], logprobs: list[float], delta: AssistantDelta, call_ids: _CallIds
) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        delta=inference_pb2.GenerateDelta(
            token_ids=token_ids,
            logprobs=logprobs,
            text=delta.text,
            reasoning_text=delta.reasoning,
            tool_calls=[
                inference_pb2.ToolCallDelta(
                    index=index, id=call_ids.get(index), name=call.name, arguments_delta=call.arguments_json
                )
                for index, call in delta.tool_calls
            ],
        )
    )


def _finish_reason(
    engine_finish: str | None, stopped: bool, parsed: ParsedAssistant
) -> common_pb2.FinishReason.ValueType:
    if stopped:
        return common_pb2.FINISH_REASON_STOP_SEQUENCE
    if engine_finish == "length":
        return common_pb2.FINISH_REASON_LENGTH
    if parsed.tool_calls:
        return common_pb2.FINISH_REASON_TOOL_CALLS
    return common_pb2.FINISH_REASON_STOP


def _message(parsed: ParsedAssistant, call_ids: _CallIds) -> common_pb2.ChatMessage:
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
    if parsed.reasoning:
        message.content.add(reasoning=common_pb2.ReasoningPart(text=parsed.reasoning))
    if parsed.text:
        message.content.add(text=common_pb2.TextPart(text=parsed.text))
    for index, call in enumerate(parsed.tool_calls):
        message.tool_calls.add(id=call_ids.get(index), name=call.name, arguments_json=call.arguments_json)
    return message
