"""Anthropic Messages streaming: message_start, content_block_start/delta/stop per block (thinking with its
signature_delta, text, tool_use with input_json_delta), message_delta (stop reason, usage), message_stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lodestar.errors import LodestarError, UnavailableError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import sse
from lodestar_gateway.canonical import CallResult
from lodestar_gateway.dialects.base import JsonObject
from lodestar_gateway.dialects.common import encode_reasoning

if TYPE_CHECKING:
    from lodestar_gateway.canonical import CanonicalRequest

_STOP_REASONS = {
    common_pb2.FINISH_REASON_STOP: "end_turn",
    common_pb2.FINISH_REASON_LENGTH: "max_tokens",
    common_pb2.FINISH_REASON_STOP_SEQUENCE: "stop_sequence",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_use",
    common_pb2.FINISH_REASON_CANCELLED: "end_turn",
}


def stop_reason(reason: common_pb2.FinishReason.ValueType) -> str:
    return _STOP_REASONS.get(reason, "end_turn")


def usage(final: inference_pb2.GenerateFinal) -> JsonObject:
    return {
        "input_tokens": final.usage.prompt_tokens,
        "output_tokens": final.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class AnthropicStream:
    """Renders one streamed Anthropic message."""

    content_type = "text/event-stream; charset=utf-8"

    def __init__(self, request: CanonicalRequest) -> None:
        self._model = request.model
        self._index = -1
        self._open: str | None = None  # "thinking" | "text" | "tool_use"
        self._tool_index = -1
        self._reasoning: list[str] = []

    def start(self, response_id: str, created: int) -> bytes:
        message: JsonObject = {
            "id": response_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return sse.event("message_start", {"type": "message_start", "message": message})

    def delta(self, delta: inference_pb2.GenerateDelta) -> bytes:
        out = bytearray()
        if delta.reasoning_text:
            if self._open != "thinking":
                out += self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._reasoning.append(delta.reasoning_text)
            out += self._block_delta({"type": "thinking_delta", "thinking": delta.reasoning_text})
        if delta.text:
            if self._open != "text":
                out += self._begin("text", {"type": "text", "text": ""})
            out += self._block_delta({"type": "text_delta", "text": delta.text})
        for call in delta.tool_calls:
            if self._open != "tool_use" or call.index != self._tool_index:
                self._tool_index = call.index
                block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                out += self._begin("tool_use", block)
            if call.arguments_delta:
                out += self._block_delta({"type": "input_json_delta", "partial_json": call.arguments_delta})
        return bytes(out)

    def finish(self, result: CallResult) -> bytes:
        out = bytearray(self._end())
        final = result.final
        body = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(final.finish_reason), "stop_sequence": final.matched_stop or None},
            "usage": usage(final),
        }
        out += sse.event("message_delta", body)
        out += sse.event("message_stop", {"type": "message_stop"})
        return bytes(out)

    def error(self, error: LodestarError) -> bytes:
        kind = "overloaded_error" if isinstance(error, UnavailableError) else "api_error"
        return sse.event("error", {"type": "error", "error": {"type": kind, "message": error.message}})

    def _begin(self, kind: str, block: JsonObject) -> bytes:
        out = self._end()
        self._index += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + sse.event("content_block_start", start)

    def _block_delta(self, delta: JsonObject) -> bytes:
        return sse.event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _end(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            signature = encode_reasoning("".join(self._reasoning))
            out = self._block_delta({"type": "signature_delta", "signature": signature})
            self._reasoning = []
        self._open = None
        return out + sse.event("content_block_stop", {"type": "content_block_stop", "index": self._index})
