"""One proxied model call: continuation lookup, Generate, capture — independent of dialect and transport.

`Proxy.call` yields each inference delta as it arrives (tool-call ids filled in) and, last, the
`CallResult`. The session's sampling policy replaces the client's temperature / top_p / top_k (the record
keeps both: `sampling` used, `requested_sampling` asked). The CallRecord is committed to the capture store
BEFORE the result is yielded, so a response can only complete after its record is durable; a client that
disconnects just then does not lose it (the write is shielded). The new chain link is registered once the
record is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import NamedTuple, Protocol

from lodestar.errors import InvalidArgumentError, LodestarError, UnavailableError
from lodestar.logging import get_logger
from lodestar.sampling import applied_sampling
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway.canonical import CallResult, CanonicalRequest, new_id, now_seconds
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.continuation import ChainIndex, ChainLink, ChainMatch, MessageKey, context_key, message_keys
from lodestar_gateway.sessions import SessionEntry, timestamp_now
from lodestar_gateway.unknown_fields import UnknownFields

_log = get_logger("gateway.proxy")


class Unanswered(NamedTuple):
    """A session's model calls that failed since its last answered one."""

    failed: int = 0
    last_error: str = ""
    refused: bool = False
    """The last failure was inference refusing the request itself (INVALID_ARGUMENT: a prompt over the
    context length): the agent's doing, not an outage."""
    abandoned: int = 0
    """Streamed answers the caller stopped reading while they still flowed (a delta sent to it less than
    `STALL_S` before it left): the harness's own choice, not an outage (Gemini CLI cancels a stream its loop
    detection flags, then exits 0). Not failures; no record (the tokens it read are not trained on)."""


STALL_S = 5.0
"""A streamed answer that sent its caller nothing for this long has stalled: a caller that leaves it gave up
waiting (an infrastructure failure); one that leaves an answer still flowing stopped reading by choice."""


class InferenceBackend(Protocol):
    """What the gateway needs from InferenceService (the gRPC adapter implements it)."""

    def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Stream deltas then one final; raises LodestarError (UnavailableError when unreachable)."""
        ...

    async def count_tokens(self, request: inference_pb2.CountTokensRequest) -> int: ...

    async def model_info(self) -> inference_pb2.GetModelInfoResponse: ...


class Proxy:
    """Runs calls against inference and captures them."""

    def __init__(
        self,
        inference: InferenceBackend,
        store: CaptureStore,
        chains: ChainIndex | None = None,
        *,
        unknown_fields: UnknownFields | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self._inference = inference
        self._store = store
        self._chains = chains or ChainIndex()
        self.unknown_fields = unknown_fields or UnknownFields()
        """Policy and counts of unknown top-level request fields (checked by the transport after parsing)."""
        self.calls_captured = 0
        self._background: set[asyncio.Future[None]] = set()
        self.chain_breaks = 0
        """Calls that drifted: they share conversation with an earlier call but do not extend it."""
        self.streams_abandoned = 0
        """Streamed answers their caller stopped reading while they flowed (`Unanswered.abandoned`)."""
        self.branches = 0
        """Calls that started a new conversation in a session with earlier calls (compaction, sub-agents)."""
        self.unanswered: dict[str, Unanswered] = {}
        """Per session: the calls that failed since its last answered call. The node lifecycle reads it to
        tell "inference was down" from a harness that simply finished or overflowed its context."""
        self.in_flight: dict[str, dict[str, float]] = {}
        """Per session: calls begun and not yet answered or failed, each with the monotonic time a streamed
        delta last went to its caller (0.0: none yet, or not streamed). A harness that gave up on a call (its
        own timeout) and exited leaves it here: `take_unanswered` counts it as failed (the chaos hour scored a
        session from its first call while its second waited: docs/chaos.md)."""
        self.stall_s = stall_s

    @property
    def chains(self) -> ChainIndex:
        return self._chains

    async def call(
        self, session: SessionEntry, request: CanonicalRequest, original_body: bytes, *, response_id: str
    ) -> AsyncGenerator[inference_pb2.GenerateDelta | CallResult, None]:
        if not self._chains.has(session.session_id):
            await self._load_chains(session.session_id)
        clock = time.perf_counter()
        keys = message_keys(request.messages)
        context = context_key(request.tools)
        policy = session.session.sampling_policy if session.session.HasField("sampling_policy") else None
        generate = self._generate_request(request, response_id, policy)
        generate.session_id = session.session_id  # several replicas: every call of a session on one
        match = self._match(session.session_id, context, keys, request)
        found = match.link
        if found is not None:
            generate.continuation.CopyFrom(found.continuation)
        started_at = timestamp_now()

        def request_half() -> common_pb2.CallRecord:  # built and written on the store's thread, while generating
            return common_pb2.CallRecord(
                session_id=session.session_id,
                dialect=request.dialect,
                messages=generate.messages,
                original_request_json=original_body.decode("utf-8", errors="replace"),
                tools=generate.tools,
                sampling=generate.sampling,
                requested_sampling=request.sampling,
                started_at=started_at,
            )

        begun = asyncio.ensure_future(self._store.begin(response_id, request_half))
        answered = False
        waiting = self.in_flight.setdefault(session.session_id, {})
        waiting[response_id] = 0.0
        try:
            call_ids: dict[int, str] = {}
            sent = time.perf_counter()
            first_token_ms = 0.0
            async for event in self._inference.generate(generate):
                first_token_ms = first_token_ms or (time.perf_counter() - sent) * 1e3
                if event.WhichOneof("event") == "delta":
                    for call in event.delta.tool_calls:
                        if call.id or call.index not in call_ids:
                            call.id = call_ids.setdefault(call.index, call.id or new_id("call_"))
                    yield event.delta
                    if request.stream:
                        waiting[response_id] = time.monotonic()  # it reached the caller: the answer flows
                    continue
                arrived = time.perf_counter()
                final = event.final
                completion = _completion(final.message, call_ids)
                continued = found.sequence if found is not None and final.continuation_used else -1
                start = match.start if continued >= 0 or found is None else common_pb2.CHAIN_START_DRIFT
                result_half = _result_half(session.session_id, final, completion, continued, start, first_token_ms)
                link_keys = [*keys, *message_keys([completion])]
                link = ChainLink(-1, context, link_keys, _continuation(result_half, len(link_keys)))
                await begun
                answered = True  # from here the record is completed even if this call is cancelled (shield)
                sequence = await asyncio.shield(self._capture(session, response_id, result_half, link, found))
                timings = {
                    "prepare_ms": (sent - clock) * 1e3,
                    "inference_ms": (arrived - sent) * 1e3,
                    "capture_ms": (time.perf_counter() - arrived) * 1e3,
                }
                yield CallResult(final, completion, response_id, now_seconds(), sequence, timings)
                return
            raise UnavailableError("inference ended the stream without a final result")
        except LodestarError as error:
            self._unanswered(session.session_id, error.message, refused=isinstance(error, InvalidArgumentError))
            raise
        except (asyncio.CancelledError, GeneratorExit):  # the caller went away before the answer
            if not answered:
                self._went_away(session.session_id, waiting[response_id])
            raise
        finally:
            waiting.pop(response_id, None)
            if not waiting and self.in_flight.get(session.session_id) is waiting:
                del self.in_flight[session.session_id]
            if not answered:
                self._discard(begun, response_id)

    def _flowing(self, delivered_at: float) -> bool:
        """Whether a streamed answer last delivered at `delivered_at` was still flowing to its caller."""
        return bool(delivered_at) and time.monotonic() - delivered_at < self.stall_s

    def _went_away(self, session_id: str, delivered_at: float) -> None:
        """A caller left before its answer: by choice from a flowing stream, else it gave up (its own timeout,
        a kill) and the call failed."""
        if not self._flowing(delivered_at):
            self._unanswered(session_id, "the caller went away before the answer")
            return
        unanswered = self.unanswered.get(session_id, Unanswered())
        self.unanswered[session_id] = unanswered._replace(abandoned=unanswered.abandoned + 1)
        self.streams_abandoned += 1
        _log.info("caller stopped reading", session_id=session_id, since_delta_s=time.monotonic() - delivered_at)

    def _unanswered(self, session_id: str, why: str, *, refused: bool = False) -> None:
        unanswered = self.unanswered.get(session_id, Unanswered())
        self.unanswered[session_id] = Unanswered(unanswered.failed + 1, why, refused, unanswered.abandoned)

    def take_unanswered(self, session_id: str) -> Unanswered:
        """The session's calls that failed since its last answered one, and those still waiting for an answer
        (counted as failed: the harness that made them has finished, unless it was reading a flowing stream:
        abandoned); forgets them."""
        unanswered = self.unanswered.pop(session_id, Unanswered())
        waiting = list(self.in_flight.get(session_id, {}).values())
        flowing = sum(map(self._flowing, waiting))
        stalled = len(waiting) - flowing
        unanswered = unanswered._replace(abandoned=unanswered.abandoned + flowing)
        if not stalled:
            return unanswered
        why = f"{stalled} call(s) still waiting for inference when the harness finished"
        return unanswered._replace(failed=unanswered.failed + stalled, last_error=why, refused=False)

    def _match(self, session_id: str, context: bytes, keys: list[MessageKey], request: CanonicalRequest) -> ChainMatch:
        """The chain this call continues, if any; a call that starts a new chain (other than the session's first)
        is counted (a drift or a branch) and logged."""
        roles = [message.role for message in request.messages]
        match = self._chains.find(session_id, context, keys, roles=roles)
        if match.link is None and match.start != common_pb2.CHAIN_START_FIRST:
            drift = match.start == common_pb2.CHAIN_START_DRIFT
            self.chain_breaks += drift
            self.branches += not drift
            _log.info(
                "new chain",
                session_id=session_id,
                kind="drift" if drift else "branch",
                closest_sequence=match.closest_sequence,
                first_difference=match.first_difference,
                reason=match.reason,
            )
        return match

    async def _capture(
        self,
        session: SessionEntry,
        call_id: str,
        result_half: common_pb2.CallRecord,
        link: ChainLink,
        parent: ChainLink | None,
    ) -> int:
        result_half.sequence = link.sequence = session.take_sequence()
        result_half.finished_at.CopyFrom(timestamp_now())
        await self._store.append(call_id, result_half)
        self.calls_captured += 1
        self.unanswered.pop(session.session_id, None)
        self._chains.add(session.session_id, link, parent)
        return result_half.sequence

    def _discard(self, begun: asyncio.Future[None], call_id: str) -> None:
        """Drop the request half of an unanswered call (in the background: the caller may be cancelled)."""

        async def discard() -> None:
            with contextlib.suppress(Exception):
                await begun
            await self._store.discard(call_id)

        task = asyncio.ensure_future(discard())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _load_chains(self, session_id: str) -> None:
        """Rebuild a session's chain links from its captured records (after a restart)."""
        links = []
        for record in await self._store.calls(session_id):
            keys = message_keys([*record.messages, record.completion])
            links.append(ChainLink(record.sequence, context_key(record.tools), keys, _continuation(record, len(keys))))
        if not self._chains.has(session_id):
            self._chains.load(session_id, links)

    def _generate_request(
        self, request: CanonicalRequest, response_id: str, policy: common_pb2.SamplingPolicy | None
    ) -> inference_pb2.GenerateRequest:
        """The Generate request of a call; sampling: the session's policy over the client's (lodestar/sampling.py)."""
        generate = inference_pb2.GenerateRequest(
            request_id=response_id,
            model=request.model,
            messages=request.messages,
            tools=request.tools,
            sampling=applied_sampling(request.sampling, policy),
            stream=request.stream,
        )
        if request.tool_choice is not None:
            generate.tool_choice.CopyFrom(request.tool_choice)
        if request.enable_thinking is not None:
            generate.enable_thinking = request.enable_thinking
        return generate

    async def count_tokens(self, request: CanonicalRequest) -> int:
        count = inference_pb2.CountTokensRequest(messages=request.messages, tools=request.tools)
        return await self._inference.count_tokens(count)

    async def model_info(self) -> inference_pb2.GetModelInfoResponse:
        return await self._inference.model_info()


def _result_half(
    session_id: str,
    final: inference_pb2.GenerateFinal,
    completion: common_pb2.ChatMessage,
    continued: int,
    start: common_pb2.ChainStart.ValueType,
    first_token_ms: float,
) -> common_pb2.CallRecord:
    """The half of a call's record known once inference answered (the request half was written before)."""
    return common_pb2.CallRecord(
        session_id=session_id,
        prompt_token_ids=final.prompt_token_ids,
        completion_token_ids=final.completion_token_ids,
        completion_logprobs=final.completion_logprobs,
        finish_reason=final.finish_reason,
        completion=completion,
        policy_version=final.policy_version,
        usage=final.usage,
        continued_from_sequence=continued,
        first_token_ms=first_token_ms,
        chain_start=start,
        inference_replica=final.served_by,
        policy_version_spans=final.policy_version_spans,
    )


def _completion(message: common_pb2.ChatMessage, call_ids: dict[int, str]) -> common_pb2.ChatMessage:
    completion = common_pb2.ChatMessage()
    completion.CopyFrom(message)
    completion.role = common_pb2.ROLE_ASSISTANT
    for index, call in enumerate(completion.tool_calls):
        call.id = call_ids.get(index) or call.id or new_id("call_")
    return completion


def _continuation(record: common_pb2.CallRecord, covered: int) -> inference_pb2.Continuation:
    """Prompt + sampled ids of a captured call, covering its `covered` messages (request + completion)."""
    continuation = inference_pb2.Continuation(token_ids=record.prompt_token_ids, message_count=covered)
    continuation.token_ids.extend(record.completion_token_ids)
    return continuation
