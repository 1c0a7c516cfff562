"""The canonical request every dialect parses into, the call result every dialect renders, and the
dialect-independent checks on canonical chats (tool results must answer an earlier tool call).

Canonical messages are `lodestar.v1` protobuf messages (ChatMessage, ToolDefinition, SamplingParams): the
same objects travel to inference and into the CallRecord without another conversion.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2, inference_pb2

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
"""Claude Code sends this as a per-request first system line; it changes every call, so it is dropped."""


@dataclass
class CanonicalRequest:
    """A vendor request normalized to the canonical chat form."""

    dialect: common_pb2.Dialect.ValueType
    model: str
    messages: list[common_pb2.ChatMessage]
    tools: list[common_pb2.ToolDefinition] = field(default_factory=list)
    tool_choice: common_pb2.ToolChoice | None = None
    sampling: common_pb2.SamplingParams = field(default_factory=common_pb2.SamplingParams)
    stream: bool = False
    enable_thinking: bool | None = None
    render: Any = None
    """Dialect-specific rendering context (tool namespaces, reasoning options); opaque to the proxy."""
    unknown_fields: list[str] = field(default_factory=list)
    """Top-level body fields the dialect does not know (accepted and ignored unless --strict-fields)."""


@dataclass
class CallResult:
    """A finished generation as the dialects render it."""

    final: inference_pb2.GenerateFinal
    message: common_pb2.ChatMessage
    """The assistant message returned to the client (tool-call ids filled in)."""
    response_id: str
    created: int
    sequence: int
    """Sequence number of the CallRecord this call was captured as."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Where the call's time went (for the request log line): prepare, inference, capture."""

    @property
    def reasoning_text(self) -> str:
        return "".join(p.reasoning.text for p in self.message.content if p.WhichOneof("part") == "reasoning")

    @property
    def text(self) -> str:
        return "".join(p.text.text for p in self.message.content if p.WhichOneof("part") == "text")


def new_id(prefix: str) -> str:
    """A vendor-looking random id (`msg_…`, `call_…`)."""
    return f"{prefix}{secrets.token_hex(12)}"


def now_seconds() -> int:
    return int(time.time())


def text_part(text: str) -> common_pb2.ContentPart:
    return common_pb2.ContentPart(text=common_pb2.TextPart(text=text))


def reasoning_part(
    text: str, *, signature: str = "", encrypted: str = "", redacted: bool = False
) -> common_pb2.ContentPart:
    return common_pb2.ContentPart(
        reasoning=common_pb2.ReasoningPart(
            text=text, signature=signature, encrypted_content=encrypted, redacted=redacted
        )
    )


def strip_billing_header(text: str) -> str:
    """Drop a leading `x-anthropic-billing-header:` line (and only that line)."""
    if not text.startswith(BILLING_HEADER_PREFIX):
        return text
    _, _, rest = text.partition("\n")
    return rest


def tool_call_ids(message: common_pb2.ChatMessage) -> list[str]:
    return [call.id for call in message.tool_calls]


def check_tool_results(messages: list[common_pb2.ChatMessage]) -> None:
    """Every tool result must answer a tool call made by an earlier assistant message."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == common_pb2.ROLE_ASSISTANT:
            called.update(tool_call_ids(message))
        elif message.role == common_pb2.ROLE_TOOL:
            call_id = message.tool_result.tool_call_id
            if not call_id:
                raise InvalidArgumentError(f"message {index}: tool result without a tool call id")
            if call_id not in called:
                raise InvalidArgumentError(
                    f"message {index}: tool result for '{call_id}' has no matching tool call in an "
                    "earlier assistant message"
                )


def check_not_empty(messages: list[common_pb2.ChatMessage], field_name: str) -> None:
    if not any(m.role != common_pb2.ROLE_SYSTEM and m.role != common_pb2.ROLE_DEVELOPER for m in messages):
        raise InvalidArgumentError(f"{field_name}: at least one user or assistant message is required")
