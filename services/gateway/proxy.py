"""One proxied model call: continuation lookup, Generate, capture — independent of dialect and transport.

`Proxy.call` yields each inference delta as it arrives (tool-call ids filled in) and, last, the
`CallResult`. The CallRecord is committed to the capture store BEFORE the result is yielded, so a
response can only complete after its record is durable; a client that disconnects just then does not
lose it (the write is shielded). The new chain link is registered once the record is durable.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from lodestar.errors import UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import common_pb2, inference_pb2
from services.gateway.canonical import CallResult, CanonicalRequest, new_id, now_seconds
from services.gateway.capture import CaptureStore
from services.gateway.continuation import ChainIndex, ChainLink, MessageKey, PrefixMiss, context_key, message_keys
from services.gateway.sessions import SessionEntry, timestamp_now

_log = get_logger("gateway.proxy")


class InferenceBackend(Protocol):
    """What the gateway needs from InferenceService (the gRPC adapter implements it)."""

    def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Stream deltas then one final; raises LodestarError (UnavailableError when unreachable)."""
        ...

    async def count_tokens(self, request: inference_pb2.CountTokensRequest) -> int: ...

    async def model_info(self) -> inference_pb2.GetModelInfoResponse: ...


class Proxy:
    """Runs calls against inference and captures them."""

    def __init__(self, inference: InferenceBackend, store: CaptureStore, chains: ChainIndex | None = None) -> None:
        self._inference = inference
        self._store = store
        self._chains = chains or ChainIndex()
        self.calls_captured = 0
        self.chain_breaks = 0

    @property
    def chains(self) -> ChainIndex:
        return self._chains

    async def call(
        self, session: SessionEntry, request: CanonicalRequest, original_body: bytes, *, response_id: str
    ) -> AsyncGenerator[inference_pb2.GenerateDelta | CallResult, None]:
        if not self._chains.has(session.session_id):
            await self._load_chains(session.session_id)
        started = timestamp_now()
        clock = time.perf_counter()
        keys = message_keys(request.messages)
        context = context_key(request.tools)
        generate = self._generate_request(request, response_id)
        found = self._chains.find(session.session_id, context, keys)
        if isinstance(found, ChainLink):
            generate.continuation.token_ids.extend(found.token_ids)
            generate.continuation.message_count = len(found.keys)
        elif isinstance(found, PrefixMiss):
            self.chain_breaks += 1
            _log.info("new chain", session_id=session.session_id, closest_sequence=found.sequence,
                      first_difference=found.first_difference, reason=found.reason)  # fmt: skip
        call_ids: dict[int, str] = {}
        first_token_ms = 0.0
        async for event in self._inference.generate(generate):
            kind = event.WhichOneof("event")
            if kind == "delta":
                if not first_token_ms:
                    first_token_ms = (time.perf_counter() - clock) * 1e3
                for call in event.delta.tool_calls:
                    if call.id or call.index not in call_ids:
                        call.id = call_ids.setdefault(call.index, call.id or new_id("call_"))
                yield event.delta
            elif kind == "final":
                if not first_token_ms:
                    first_token_ms = (time.perf_counter() - clock) * 1e3
                final = event.final
                completion = _completion(final.message, call_ids)
                continued = found.sequence if isinstance(found, ChainLink) and final.continuation_used else -1
                record = common_pb2.CallRecord(
                    session_id=session.session_id, dialect=request.dialect,
                    original_request_json=original_body.decode("utf-8", errors="replace"),
                    messages=generate.messages, tools=generate.tools, sampling=generate.sampling,
                    prompt_token_ids=final.prompt_token_ids, completion_token_ids=final.completion_token_ids,
                    completion_logprobs=final.completion_logprobs, finish_reason=final.finish_reason,
                    completion=completion, policy_version=final.policy_version, usage=final.usage,
                    continued_from_sequence=continued, started_at=started, first_token_ms=first_token_ms,
                )  # fmt: skip
                link_keys = [*keys, *message_keys([completion])]
                sequence = await asyncio.shield(self._capture(session, record, context, link_keys))
                yield CallResult(final, completion, response_id, now_seconds(), sequence)
                return
        raise UnavailableError("inference ended the stream without a final result")

    async def _capture(
        self, session: SessionEntry, record: common_pb2.CallRecord, context: bytes, keys: list[MessageKey]
    ) -> int:
        record.sequence = session.take_sequence()
        record.finished_at.CopyFrom(_now())
        await self._store.append(record)
        self.calls_captured += 1
        token_ids = array("I", record.prompt_token_ids)
        token_ids.extend(record.completion_token_ids)
        self._chains.add(session.session_id, ChainLink(record.sequence, context, keys, token_ids))
        return record.sequence

    async def _load_chains(self, session_id: str) -> None:
        """Rebuild a session's chain links from its captured records (after a restart)."""
        links = []
        for record in await self._store.calls(session_id):
            token_ids = array("I", record.prompt_token_ids)
            token_ids.extend(record.completion_token_ids)
            keys = message_keys([*record.messages, record.completion])
            links.append(ChainLink(record.sequence, context_key(record.tools), keys, token_ids))
        if not self._chains.has(session_id):
            self._chains.load(session_id, links)

    def _generate_request(self, request: CanonicalRequest, response_id: str) -> inference_pb2.GenerateRequest:
        generate = inference_pb2.GenerateRequest(
            request_id=response_id, model=request.model, messages=request.messages, tools=request.tools,
            sampling=request.sampling, stream=request.stream,
        )  # fmt: skip
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


def _completion(message: common_pb2.ChatMessage, call_ids: dict[int, str]) -> common_pb2.ChatMessage:
    completion = common_pb2.ChatMessage()
    completion.CopyFrom(message)
    completion.role = common_pb2.ROLE_ASSISTANT
    for index, call in enumerate(completion.tool_calls):
        call.id = call_ids.get(index) or call.id or new_id("call_")
    return completion


def _now() -> Timestamp:
    return timestamp_now()
