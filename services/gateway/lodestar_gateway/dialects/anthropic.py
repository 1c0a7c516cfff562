"""Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): parse, render, errors.

Harness quirks handled here (HARNESSES.md): Claude Code's per-request `x-anthropic-billing-header:` system
line is dropped; `role: "system"` messages inside `messages` become canonical system messages in place;
`cache_control`, `thinking`, `context_management`, `output_config` and `metadata` are accepted (the
markers are ignored); Pi's string `system` works like the block list. Streaming is in `anthropic_stream`.
"""

from __future__ import annotations

from typing import Any

from lodestar.errors import ContextLengthExceededError, LodestarError
from lodestar.v1 import common_pb2
from lodestar_gateway import canonical as cn
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects import fields as f
from lodestar_gateway.dialects import sampling as sampling_fields
from lodestar_gateway.dialects.anthropic_stream import AnthropicStream, stop_reason, usage
from lodestar_gateway.dialects.base import JsonObject, Route
from lodestar_gateway.dialects.common import (
    arguments_object,
    arguments_text,
    decode_reasoning,
    encode_reasoning,
    image_from_base64,
    image_from_url,
    tool_definition,
)
from lodestar_gateway.dialects.sampling import read_sampling
from lodestar_gateway.errors import http_status

_COMMON_FIELDS = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers", "context_management"}
)
MESSAGES_FIELDS = _COMMON_FIELDS | {
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "output_config",
    "output_format",
    "container",
    "service_tier",
    "betas",
    "inference_geo",
    "speed",
    "cache_control",
}
COUNT_FIELDS = _COMMON_FIELDS | {"output_config", "output_format", "betas", "cache_control"}
_ROLES = {"user": common_pb2.ROLE_USER, "assistant": common_pb2.ROLE_ASSISTANT, "system": common_pb2.ROLE_SYSTEM}
_SERVER_TOOL_PREFIXES = ("web_search", "web_fetch", "code_execution", "computer", "bash_", "text_editor", "memory")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    501: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class AnthropicMessages:
    """The Anthropic Messages dialect."""

    dialect = common_pb2.DIALECT_ANTHROPIC_MESSAGES
    name = "anthropic"

    def parse(self, body: Any, route: Route, *, count_tokens: bool = False) -> CanonicalRequest:
        body = f.expect_object(body, "body")
        model = f.string(body, "model", required=True) or ""
        raw_messages = f.array(body, "messages", required=True) or []
        messages = _system_messages(body.get("system"))
        for index, raw in enumerate(raw_messages):
            messages.extend(_message(raw, f"messages.{index}"))
        cn.check_not_empty(messages, "messages")
        cn.check_tool_results(messages)
        request = CanonicalRequest(dialect=self.dialect, model=model, messages=messages)
        request.tools = _tools(f.array(body, "tools") or [])
        request.tool_choice = _tool_choice(body.get("tool_choice"))
        request.enable_thinking = _thinking(body.get("thinking"))
        request.unknown_fields = f.unknown_fields(body, COUNT_FIELDS if count_tokens else MESSAGES_FIELDS)
        if count_tokens:
            return request
        request.sampling = read_sampling(body, sampling_fields.ANTHROPIC)
        f.obj(body, "metadata")
        request.stream = bool(f.boolean(body, "stream"))
        return request

    def render(self, request: CanonicalRequest, result: CallResult) -> JsonObject:
        return {
            "id": result.response_id,
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": content_blocks(result.message),
            "stop_reason": stop_reason(result.final.finish_reason),
            "stop_sequence": result.final.matched_stop or None,
            "usage": usage(result.final),
        }

    def stream(self, request: CanonicalRequest) -> AnthropicStream:
        return AnthropicStream(request)

    def error(self, error: LodestarError) -> tuple[int, JsonObject]:
        if isinstance(error, ContextLengthExceededError):  # Claude Code compacts on exactly these words
            message = f"prompt is too long: {error.prompt_tokens} tokens > {error.context_length} maximum"
            return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        status = http_status(error)
        kind = _ERROR_TYPES.get(status, "api_error")
        if status == 503:
            status = 529  # Anthropic's "overloaded": Claude Code and the SDK retry it
        return status, {"type": "error", "error": {"type": kind, "message": error.message}}


def content_blocks(message: common_pb2.ChatMessage) -> list[JsonObject]:
    """An assistant message as Anthropic content blocks (thinking, text, tool_use)."""
    blocks: list[JsonObject] = []
    for part in message.content:
        kind = part.WhichOneof("part")
        if kind == "reasoning":
            text = part.reasoning.text
            blocks.append({"type": "thinking", "thinking": text, "signature": encode_reasoning(text)})
        elif kind == "text" and part.text.text:
            blocks.append({"type": "text", "text": part.text.text})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call.arguments_json)}
        )
    return blocks


def _system_messages(system: Any) -> list[common_pb2.ChatMessage]:
    if system is None:
        return []
    parts: list[common_pb2.ContentPart] = []
    if isinstance(system, str):
        text = cn.strip_billing_header(system)
        if text:
            parts.append(cn.text_part(text))
    elif isinstance(system, list):
        for index, block in enumerate(system):
            block = f.expect_object(block, f"system.{index}")
            if block.get("type") != "text":
                raise f.fail(f"system.{index}.type", "system blocks must be text blocks")
            text = cn.strip_billing_header(f.string(block, "text", f"system.{index}", required=True) or "")
            if text:
                parts.append(cn.text_part(text))
    else:
        raise f.fail("system", f"expected a string or an array of text blocks, got {f.type_name(system)}")
    return [common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=parts)] if parts else []


def _message(raw: Any, path: str) -> list[common_pb2.ChatMessage]:
    """One Anthropic message; a user message's tool_result blocks become canonical tool messages."""
    raw = f.expect_object(raw, path)
    role_name = f.string(raw, "role", path, required=True)
    role = _ROLES.get(role_name or "")
    if role is None:
        raise f.fail(f"{path}.role", f"must be 'user' or 'assistant', got {role_name!r}")
    content = raw.get("content")
    if isinstance(content, str):
        return [common_pb2.ChatMessage(role=role, content=[cn.text_part(content)])]
    blocks = f.array(raw, "content", path, required=True) or []
    if not blocks and role != common_pb2.ROLE_ASSISTANT:
        raise f.fail(f"{path}.content", "must not be empty")
    out: list[common_pb2.ChatMessage] = []
    current = common_pb2.ChatMessage(role=role)
    for index, block in enumerate(blocks):
        block_path = f"{path}.content.{index}"
        block = f.expect_object(block, block_path)
        kind = f.string(block, "type", block_path, required=True)
        if kind == "tool_result":
            if role != common_pb2.ROLE_USER:
                raise f.fail(block_path, "tool_result blocks are only allowed in user messages")
            if current.content:
                out.append(current)
                current = common_pb2.ChatMessage(role=role)
            out.append(_tool_result(block, block_path))
        elif kind == "tool_use":
            if role != common_pb2.ROLE_ASSISTANT:
                raise f.fail(block_path, "tool_use blocks are only allowed in assistant messages")
            current.tool_calls.append(
                common_pb2.ToolCall(
                    id=f.string(block, "id", block_path, required=True) or "",
                    name=f.string(block, "name", block_path, required=True) or "",
                    arguments_json=arguments_text(block.get("input"), f"{block_path}.input"),
                )
            )
        else:
            current.content.append(_content_part(block, kind or "", block_path, role))
    if current.content or current.tool_calls or not out:
        out.append(current)
    return out


def _content_part(block: JsonObject, kind: str, path: str, role: int) -> common_pb2.ContentPart:
    if kind == "text":
        return cn.text_part(f.string(block, "text", path, required=True) or "")
    if kind == "image":
        return common_pb2.ContentPart(image=_image(block, path))
    if kind == "document":
        source = f.obj(block, "source", path, required=True) or {}
        if source.get("type") == "text":
            return cn.text_part(f.string(source, "data", f"{path}.source", required=True) or "")
        raise f.fail(f"{path}.source.type", "only text documents are supported")
    if kind in ("thinking", "redacted_thinking"):
        if role != common_pb2.ROLE_ASSISTANT:
            raise f.fail(path, f"{kind} blocks are only allowed in assistant messages")
        if kind == "redacted_thinking":
            data = f.string(block, "data", path, required=True) or ""
            return cn.reasoning_part(decode_reasoning(data) or "", signature=data, redacted=True)
        signature = f.string(block, "signature", path) or ""
        return cn.reasoning_part(f.string(block, "thinking", path, required=True) or "", signature=signature)
    raise f.fail(f"{path}.type", f"unsupported content block type {kind!r}")


def _image(block: JsonObject, path: str) -> common_pb2.ImagePart:
    source = f.obj(block, "source", path, required=True) or {}
    source_type = source.get("type")
    if source_type == "base64":
        return image_from_base64(source.get("media_type"), source.get("data"), f"{path}.source")
    if source_type == "url":
        return image_from_url(source.get("url"), f"{path}.source.url")
    raise f.fail(f"{path}.source.type", f"unsupported image source {source_type!r} (use base64 or url)")


def _tool_result(block: JsonObject, path: str) -> common_pb2.ChatMessage:
    result = common_pb2.ToolResult(
        tool_call_id=f.string(block, "tool_use_id", path, required=True) or "",
        is_error=bool(f.boolean(block, "is_error", path)),
    )
    content = block.get("content")
    if isinstance(content, str):
        result.content.append(cn.text_part(content))
    elif isinstance(content, list):
        for index, item in enumerate(content):
            item_path = f"{path}.content.{index}"
            item = f.expect_object(item, item_path)
            kind = f.string(item, "type", item_path, required=True) or ""
            if kind not in ("text", "image", "document"):
                raise f.fail(f"{item_path}.type", f"unsupported tool result content type {kind!r}")
            result.content.append(_content_part(item, kind, item_path, common_pb2.ROLE_USER))
    elif content is not None:
        raise f.fail(f"{path}.content", f"expected a string or an array, got {f.type_name(content)}")
    return common_pb2.ChatMessage(role=common_pb2.ROLE_TOOL, tool_result=result)


def _tools(raw_tools: list[Any]) -> list[common_pb2.ToolDefinition]:
    tools = []
    for index, raw in enumerate(raw_tools):
        path = f"tools.{index}"
        raw = f.expect_object(raw, path)
        kind = raw.get("type")
        if isinstance(kind, str) and kind != "custom" and kind.startswith(_SERVER_TOOL_PREFIXES):
            continue  # server / Anthropic-defined tools: the served model cannot call them
        schema = f.obj(raw, "input_schema", path, required=True)
        tools.append(tool_definition(raw.get("name"), raw.get("description"), schema, path))
    return tools


def _tool_choice(raw: Any) -> common_pb2.ToolChoice | None:
    if raw is None:
        return None
    raw = f.expect_object(raw, "tool_choice")
    kind = f.string(raw, "type", "tool_choice", required=True)
    modes = {
        "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
        "any": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
        "none": common_pb2.TOOL_CHOICE_MODE_NONE,
        "tool": common_pb2.TOOL_CHOICE_MODE_NAMED,
    }
    if kind not in modes:
        raise f.fail("tool_choice.type", f"must be one of auto, any, tool, none; got {kind!r}")
    name = f.string(raw, "name", "tool_choice", required=kind == "tool") or ""
    return common_pb2.ToolChoice(mode=modes[kind], name=name)


def _thinking(raw: Any) -> bool | None:
    if raw is None:
        return None
    raw = f.expect_object(raw, "thinking")
    kind = f.string(raw, "type", "thinking", required=True)
    if kind not in ("enabled", "disabled", "adaptive"):
        raise f.fail("thinking.type", f"must be enabled, disabled or adaptive; got {kind!r}")
    f.integer(raw, "budget_tokens", "thinking", minimum=0)
    return kind != "disabled"
