"""OpenAI Chat Completions (`POST /v1/chat/completions`): parse, render, stream (chunks + `[DONE]`), errors.

Harness quirks handled here (HARNESSES.md): Qwen Code's tool results with content as an array of parts
and its leading assistant "context" turn, `stream_options.include_usage`, and vLLM-style extras
(`top_k`, `chat_template_kwargs.enable_thinking`). Reasoning is returned as `reasoning_content` (the
convention of vLLM, Qwen and DeepSeek servers) and accepted back as `reasoning_content` or `reasoning`.
"""

from __future__ import annotations

from typing import Any

from lodestar.errors import ContextLengthExceededError, LodestarError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import canonical as cn
from lodestar_gateway import sse
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects import fields as f
from lodestar_gateway.dialects.base import JsonObject, Route
from lodestar_gateway.dialects.common import arguments_string, image_from_url, tool_definition
from lodestar_gateway.dialects.sampling import OPENAI_CHAT, read_sampling
from lodestar_gateway.errors import http_status

FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "seed",
        "user",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
        "reasoning_effort",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "prediction",
        "verbosity",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "web_search_options",
        "min_p",
        "repetition_penalty",
        "chat_template_kwargs",
        "enable_thinking",
        "thinking",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "extra_body",
        "vl_high_resolution_images",
    }
)
_ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "developer": common_pb2.ROLE_DEVELOPER,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
    "tool": common_pb2.ROLE_TOOL,
}
FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_STOP_SEQUENCE: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
    common_pb2.FINISH_REASON_CANCELLED: "stop",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_exceeded",
}
_ERROR_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
    504: "timeout",
}


class OpenAIChat:
    """The OpenAI Chat Completions dialect."""

    dialect = common_pb2.DIALECT_OPENAI_CHAT
    name = "openai_chat"

    def parse(self, body: Any, route: Route, *, count_tokens: bool = False) -> CanonicalRequest:
        body = f.expect_object(body, "body")
        model = f.string(body, "model", required=True) or ""
        raw_messages = f.array(body, "messages", required=True) or []
        messages = [_message(raw, f"messages.{i}") for i, raw in enumerate(raw_messages)]
        cn.check_not_empty(messages, "messages")
        cn.check_tool_results(messages)
        request = CanonicalRequest(dialect=self.dialect, model=model, messages=messages)
        request.tools = _tools(f.array(body, "tools") or [])
        request.tool_choice = _tool_choice(body.get("tool_choice"))
        if (n := f.integer(body, "n", minimum=1)) is not None and n != 1:
            raise f.fail("n", "only n=1 is supported")
        request.sampling = read_sampling(body, OPENAI_CHAT)
        request.unknown_fields = f.unknown_fields(body, FIELDS)
        request.stream = bool(f.boolean(body, "stream"))
        options = f.obj(body, "stream_options") or {}
        request.render = {"include_usage": bool(f.boolean(options, "include_usage", "stream_options"))}
        request.enable_thinking = _enable_thinking(body)
        return request

    def render(self, request: CanonicalRequest, result: CallResult) -> JsonObject:
        message: JsonObject = {"role": "assistant", "content": result.text or None}
        if result.reasoning_text:
            message["reasoning_content"] = result.reasoning_text
        if result.message.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in result.message.tool_calls
            ]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": FINISH[result.final.finish_reason]}
        return {
            "id": result.response_id,
            "object": "chat.completion",
            "created": result.created,
            "model": request.model,
            "choices": [choice],
            "usage": usage(result.final),
        }

    def stream(self, request: CanonicalRequest) -> OpenAIChatStream:
        return OpenAIChatStream(request)

    def error(self, error: LodestarError) -> tuple[int, JsonObject]:
        if isinstance(error, ContextLengthExceededError):
            message = (
                f"This model's maximum context length is {error.context_length} tokens. However, your messages "
                f"resulted in {error.prompt_tokens} tokens. Please reduce the length of the messages."
            )
            body = {"message": message, "type": "invalid_request_error", "param": "messages"}
            return 400, {"error": {**body, "code": "context_length_exceeded"}}
        status = http_status(error)
        kind = _ERROR_TYPES.get(status, "server_error")
        return status, {
            "error": {"message": error.message, "type": kind, "param": None, "code": _ERROR_CODES.get(status)}
        }


def usage(final: inference_pb2.GenerateFinal) -> JsonObject:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OpenAIChatStream:
    """Renders `chat.completion.chunk`s: role first, then content / reasoning / tool-call deltas, then the
    finish chunk, an optional usage chunk, and `data: [DONE]`."""

    content_type = "text/event-stream; charset=utf-8"

    def __init__(self, request: CanonicalRequest) -> None:
        self._model = request.model
        self._include_usage = bool(request.render and request.render.get("include_usage"))
        self._head: JsonObject = {}

    def start(self, response_id: str, created: int) -> bytes:
        self._head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": self._model}
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, delta: inference_pb2.GenerateDelta) -> bytes:
        out = b""
        if delta.reasoning_text:
            out += self._chunk({"reasoning_content": delta.reasoning_text})
        if delta.text:
            out += self._chunk({"content": delta.text})
        if delta.tool_calls:
            calls = []
            for call in delta.tool_calls:
                item: JsonObject = {"index": call.index, "function": {"arguments": call.arguments_delta}}
                if call.id or call.name:
                    item.update(id=call.id, type="function")
                    item["function"]["name"] = call.name
                calls.append(item)
            out += self._chunk({"tool_calls": calls})
        return out

    def finish(self, result: CallResult) -> bytes:
        out = self._chunk({}, finish_reason=FINISH[result.final.finish_reason])
        if self._include_usage:
            out += sse.data({**self._head, "choices": [], "usage": usage(result.final)})
        return out + sse.DONE

    def error(self, error: LodestarError) -> bytes:
        return sse.data({"error": {"message": error.message, "type": "server_error", "param": None, "code": None}})

    def _chunk(self, delta: JsonObject, finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk: JsonObject = {**self._head, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return sse.data(chunk)


def _message(raw: Any, path: str) -> common_pb2.ChatMessage:
    raw = f.expect_object(raw, path)
    role_name = f.string(raw, "role", path, required=True) or ""
    role = _ROLES.get(role_name)
    if role is None:
        raise f.fail(f"{path}.role", f"unsupported role {role_name!r}")
    message = common_pb2.ChatMessage(role=role, name=f.string(raw, "name", path) or "")
    if role == common_pb2.ROLE_ASSISTANT:
        reasoning = f.string(raw, "reasoning_content", path) or f.string(raw, "reasoning", path)
        if reasoning:
            message.content.append(cn.reasoning_part(reasoning))
        for index, call in enumerate(f.array(raw, "tool_calls", path) or []):
            call_path = f"{path}.tool_calls.{index}"
            call = f.expect_object(call, call_path)
            function = f.obj(call, "function", call_path, required=True) or {}
            message.tool_calls.append(
                common_pb2.ToolCall(
                    id=f.string(call, "id", call_path, required=True) or "",
                    name=f.string(function, "name", f"{call_path}.function", required=True) or "",
                    arguments_json=arguments_string(function.get("arguments"), f"{call_path}.function.arguments"),
                )
            )
    parts = _content(raw.get("content"), f"{path}.content", role)
    if role == common_pb2.ROLE_TOOL:
        call_id = f.string(raw, "tool_call_id", path, required=True) or ""
        message.tool_result.CopyFrom(common_pb2.ToolResult(tool_call_id=call_id, content=parts))
    else:
        message.content.extend(parts)
    if not parts and not message.tool_calls and role != common_pb2.ROLE_ASSISTANT and "content" not in raw:
        raise f.fail(f"{path}.content", "field required")
    return message


def _content(content: Any, path: str, role: int) -> list[common_pb2.ContentPart]:
    if content is None:
        return []
    if isinstance(content, str):
        return [cn.text_part(content)] if content or role != common_pb2.ROLE_ASSISTANT else []
    if not isinstance(content, list):
        raise f.fail(path, f"expected a string or an array of content parts, got {f.type_name(content)}")
    parts = []
    for index, raw in enumerate(content):
        part_path = f"{path}.{index}"
        raw = f.expect_object(raw, part_path)
        kind = f.string(raw, "type", part_path, required=True)
        if kind == "text":
            parts.append(cn.text_part(f.string(raw, "text", part_path, required=True) or ""))
        elif kind == "refusal" and role == common_pb2.ROLE_ASSISTANT:
            parts.append(cn.text_part(f.string(raw, "refusal", part_path, required=True) or ""))
        elif kind == "image_url" and role in (common_pb2.ROLE_USER, common_pb2.ROLE_TOOL):
            image = f.obj(raw, "image_url", part_path, required=True) or {}
            parts.append(common_pb2.ContentPart(image=image_from_url(image.get("url"), f"{part_path}.image_url.url")))
        else:
            raise f.fail(f"{part_path}.type", f"unsupported content part type {kind!r} for this role")
    return parts


def _tools(raw_tools: list[Any]) -> list[common_pb2.ToolDefinition]:
    tools = []
    for index, raw in enumerate(raw_tools):
        path = f"tools.{index}"
        raw = f.expect_object(raw, path)
        if raw.get("type", "function") != "function":
            raise f.fail(f"{path}.type", f"unsupported tool type {raw.get('type')!r} (only 'function')")
        function = f.obj(raw, "function", path, required=True) or {}
        tools.append(
            tool_definition(
                function.get("name"), function.get("description"), function.get("parameters"), f"{path}.function"
            )
        )
    return tools


def _tool_choice(raw: Any) -> common_pb2.ToolChoice | None:
    if raw is None:
        return None
    modes = {
        "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
        "none": common_pb2.TOOL_CHOICE_MODE_NONE,
        "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
    }
    if isinstance(raw, str):
        if raw not in modes:
            raise f.fail("tool_choice", f"must be auto, none, required or a function; got {raw!r}")
        return common_pb2.ToolChoice(mode=modes[raw])
    raw = f.expect_object(raw, "tool_choice")
    function = f.obj(raw, "function", "tool_choice", required=True) or {}
    name = f.string(function, "name", "tool_choice.function", required=True) or ""
    return common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NAMED, name=name)


def _enable_thinking(body: JsonObject) -> bool | None:
    kwargs = f.obj(body, "chat_template_kwargs") or {}
    value = f.boolean(kwargs, "enable_thinking", "chat_template_kwargs")
    if value is None:
        value = f.boolean(body, "enable_thinking")
    if value is None and isinstance(effort := body.get("reasoning_effort"), str):
        value = effort not in ("none", "minimal")
    return value
