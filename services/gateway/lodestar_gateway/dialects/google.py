"""Google Generative Language API (`/v1beta/models/{m}:generateContent`, `:streamGenerateContent`,
`:countTokens`, also under `/v1/`): parse, render, stream (SSE with `alt=sse`, else one JSON array), errors.

Field names are accepted in both proto-JSON spellings (camelCase and snake_case). Harness quirks handled
here (HARNESSES.md): Gemini CLI's `systemInstruction`, `parametersJsonSchema`, `thinkingConfig` and the
`thoughtSignature` it adds to functionCall parts; Pi's functionCall parts without ids (ids are assigned by
position, and each functionResponse answers the oldest unanswered call of the same name). Thought parts
are returned only when `thinkingConfig.includeThoughts` is set, as the Gemini API does.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from lodestar.errors import ContextLengthExceededError, LodestarError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import canonical as cn
from lodestar_gateway import sse
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects import fields as f
from lodestar_gateway.dialects.base import JsonObject, Route
from lodestar_gateway.dialects.common import (
    arguments_object,
    arguments_text,
    image_from_base64,
    image_from_url,
    tool_definition,
)
from lodestar_gateway.dialects.sampling import GOOGLE, read_sampling
from lodestar_gateway.errors import http_status

FIELDS = frozenset(
    {
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "generationConfig",
        "safetySettings",
        "cachedContent",
        "labels",
        "model",
        "generateContentRequest",
    }
)
_FINISH = {common_pb2.FINISH_REASON_LENGTH: "MAX_TOKENS", common_pb2.FINISH_REASON_CANCELLED: "OTHER"}
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def camel(obj: JsonObject) -> JsonObject:
    """Proto-JSON accepts snake_case too: normalize the keys of one object to camelCase."""
    if not any("_" in key for key in obj):
        return obj
    return {_camel_key(key): value for key, value in obj.items()}


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


@dataclass
class GoogleContext:
    include_thoughts: bool = False
    sse: bool = True


class GoogleGenerateContent:
    """The Google generateContent dialect."""

    dialect = common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT
    name = "google"

    def parse(self, body: Any, route: Route, *, count_tokens: bool = False) -> CanonicalRequest:
        raw = f.expect_object(body, "body")
        unknown = [key for key in raw if _camel_key(key) not in FIELDS]
        body = camel(raw)
        if (nested := body.get("generateContentRequest")) is not None:  # countTokens wraps the request
            body = camel(f.expect_object(nested, "generateContentRequest"))
        model = (route.model or f.string(body, "model") or "").removeprefix("models/")
        messages = _system(body.get("systemInstruction"))
        messages.extend(_contents(f.array(body, "contents", required=True) or []))
        cn.check_not_empty(messages, "contents")
        cn.check_tool_results(messages)
        context = GoogleContext(sse=route.sse)
        request = CanonicalRequest(
            dialect=self.dialect, model=model, messages=messages, stream=route.stream, render=context
        )
        request.tools = _tools(f.array(body, "tools") or [])
        request.tool_choice = _tool_choice(body.get("toolConfig"))
        _generation_config(f.obj(body, "generationConfig") or {}, request, context)
        request.unknown_fields = unknown
        return request

    def render(self, request: CanonicalRequest, result: CallResult) -> JsonObject:
        context = request.render if isinstance(request.render, GoogleContext) else GoogleContext()
        parts = response_parts(result.message, context.include_thoughts)
        return _response(result.response_id, request.model, parts, result.final)

    def stream(self, request: CanonicalRequest) -> GoogleStream:
        return GoogleStream(request)

    def error(self, error: LodestarError) -> tuple[int, JsonObject]:
        if isinstance(error, ContextLengthExceededError):
            message = (
                f"The input token count ({error.prompt_tokens}) exceeds the maximum number of tokens allowed "
                f"({error.context_length})."
            )
            return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
        status = http_status(error)
        name = _STATUS_NAMES.get(status, "INTERNAL")
        return status, {"error": {"code": status, "message": error.message, "status": name}}


def response_parts(message: common_pb2.ChatMessage, include_thoughts: bool) -> list[JsonObject]:
    parts: list[JsonObject] = []
    for part in message.content:
        kind = part.WhichOneof("part")
        if kind == "reasoning" and include_thoughts and part.reasoning.text:
            parts.append({"text": part.reasoning.text, "thought": True})
        elif kind == "text" and part.text.text:
            parts.append({"text": part.text.text})
    for call in message.tool_calls:
        parts.append(_call_part(call.id, call.name, call.arguments_json))
    return parts


def _call_part(call_id: str, name: str, arguments: str) -> JsonObject:
    return {
        "functionCall": {"id": call_id, "name": name, "args": arguments_object(arguments)},
        "thoughtSignature": base64.b64encode(call_id.encode()).decode(),
    }


def _usage(final: inference_pb2.GenerateFinal) -> JsonObject:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


def _response(
    response_id: str, model: str, parts: list[JsonObject], final: inference_pb2.GenerateFinal | None
) -> JsonObject:
    candidate: JsonObject = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: JsonObject = {"candidates": [candidate], "modelVersion": model, "responseId": response_id}
    if final is not None:
        candidate["finishReason"] = _FINISH.get(final.finish_reason, "STOP")
        body["usageMetadata"] = _usage(final)
    return body


class GoogleStream:
    """Renders GenerateContentResponse chunks; the last carries finishReason and usageMetadata."""

    def __init__(self, request: CanonicalRequest) -> None:
        context = request.render if isinstance(request.render, GoogleContext) else GoogleContext()
        self._include_thoughts = context.include_thoughts
        self._sse = context.sse
        self.content_type = "text/event-stream; charset=utf-8" if self._sse else "application/json; charset=utf-8"
        self._model = request.model
        self._response_id = ""
        self._first = True
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]

    def start(self, response_id: str, created: int) -> bytes:
        self._response_id = response_id
        return b"" if self._sse else b"["

    def delta(self, delta: inference_pb2.GenerateDelta) -> bytes:
        parts: list[JsonObject] = []
        if delta.reasoning_text and self._include_thoughts:
            parts.append({"text": delta.reasoning_text, "thought": True})
        if delta.text:
            parts.append({"text": delta.text})
        for call in delta.tool_calls:
            self._calls.setdefault(call.index, [call.id, call.name]).append(call.arguments_delta)
        return self._chunk(_response(self._response_id, self._model, parts, None)) if parts else b""

    def finish(self, result: CallResult) -> bytes:
        # Function calls go out whole (Google never streams partial arguments), with the final chunk.
        parts = [_call_part(c.id, c.name, c.arguments_json) for c in result.message.tool_calls]
        out = self._chunk(_response(self._response_id, self._model, parts, result.final))
        return out if self._sse else out + b"]"

    def error(self, error: LodestarError) -> bytes:
        _, body = GoogleGenerateContent().error(error)
        out = self._chunk(body)
        return out if self._sse else out + b"]"

    def _chunk(self, body: JsonObject) -> bytes:
        if self._sse:
            return sse.data(body)
        prefix = b"" if self._first else b",\r\n"
        self._first = False
        return prefix + sse.dump_bytes(body)


def _system(raw: Any) -> list[common_pb2.ChatMessage]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=[cn.text_part(raw)])]
    content = f.expect_object(raw, "systemInstruction")
    parts = []
    for index, part in enumerate(f.array(content, "parts", "systemInstruction", required=True) or []):
        part = f.expect_object(part, f"systemInstruction.parts.{index}")
        parts.append(cn.text_part(f.string(part, "text", f"systemInstruction.parts.{index}", required=True) or ""))
    return [common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=parts)] if parts else []


def _contents(raw_contents: list[Any]) -> list[common_pb2.ChatMessage]:
    messages: list[common_pb2.ChatMessage] = []
    pending: list[tuple[str, str]] = []  # unanswered (name, id) calls, oldest first
    for index, raw in enumerate(raw_contents):
        path = f"contents.{index}"
        content = camel(f.expect_object(raw, path))
        role_name = f.string(content, "role", path) or "user"
        if role_name not in ("user", "model", "function"):
            raise f.fail(f"{path}.role", f"must be 'user' or 'model', got {role_name!r}")
        raw_parts = f.array(content, "parts", path, required=True) or []
        if not raw_parts:
            raise f.fail(f"{path}.parts", "must not be empty")
        role = common_pb2.ROLE_ASSISTANT if role_name == "model" else common_pb2.ROLE_USER
        current = common_pb2.ChatMessage(role=role)
        for part_index, raw_part in enumerate(raw_parts):
            part_path = f"{path}.parts.{part_index}"
            part = camel(f.expect_object(raw_part, part_path))
            if "functionResponse" in part:
                if current.content:
                    messages.append(current)
                    current = common_pb2.ChatMessage(role=role)
                messages.append(_function_response(part["functionResponse"], f"{part_path}.functionResponse", pending))
            elif "functionCall" in part:
                if role != common_pb2.ROLE_ASSISTANT:
                    raise f.fail(part_path, "functionCall parts are only allowed in model turns")
                call = _function_call(part["functionCall"], f"{part_path}.functionCall", f"call_{index}_{part_index}")
                current.tool_calls.append(call)
                pending.append((call.name, call.id))
            else:
                current.content.append(_part(part, part_path, role))
        if current.content or current.tool_calls:
            messages.append(current)
    return messages


def _part(part: JsonObject, path: str, role: int) -> common_pb2.ContentPart:
    if "text" in part:
        text = f.string(part, "text", path, required=True) or ""
        if f.boolean(part, "thought", path):
            return cn.reasoning_part(text, signature=f.string(part, "thoughtSignature", path) or "")
        return cn.text_part(text)
    if "inlineData" in part:
        data = camel(f.expect_object(part["inlineData"], f"{path}.inlineData"))
        return common_pb2.ContentPart(
            image=image_from_base64(data.get("mimeType"), data.get("data"), f"{path}.inlineData")
        )
    if "fileData" in part:
        data = camel(f.expect_object(part["fileData"], f"{path}.fileData"))
        image = image_from_url(data.get("fileUri"), f"{path}.fileData.fileUri")
        mime_type = data.get("mimeType")
        image.media_type = mime_type if isinstance(mime_type, str) else ""
        return common_pb2.ContentPart(image=image)
    known = ", ".join(sorted(part)) or "nothing"
    raise f.fail(
        path, f"unsupported part (has {known}); expected text, inlineData, fileData, functionCall or functionResponse"
    )


def _function_call(raw: Any, path: str, fallback_id: str) -> common_pb2.ToolCall:
    call = f.expect_object(raw, path)
    name = f.string(call, "name", path, required=True) or ""
    return common_pb2.ToolCall(
        id=f.string(call, "id", path) or fallback_id,
        name=name,
        arguments_json=arguments_text(call.get("args"), f"{path}.args"),
    )


def _function_response(raw: Any, path: str, pending: list[tuple[str, str]]) -> common_pb2.ChatMessage:
    response = f.expect_object(raw, path)
    name = f.string(response, "name", path, required=True) or ""
    call_id = f.string(response, "id", path)
    match = next((i for i, (_, c) in enumerate(pending) if call_id and c == call_id), None)
    if match is None:
        match = next((i for i, (n, _) in enumerate(pending) if n == name), None)
    if match is None:
        raise f.fail(
            path, f"functionResponse {call_id or name!r} has no matching functionCall in an earlier model turn"
        )
    _, matched_id = pending.pop(match)
    body = f.obj(response, "response", path) or {}
    result = common_pb2.ToolResult(tool_call_id=matched_id, name=name, content=[cn.text_part(sse.dumps(body))])
    return common_pb2.ChatMessage(role=common_pb2.ROLE_TOOL, tool_result=result)


def _tools(raw_tools: list[Any]) -> list[common_pb2.ToolDefinition]:
    tools = []
    for index, raw in enumerate(raw_tools):
        tool = camel(f.expect_object(raw, f"tools.{index}"))
        for decl_index, decl in enumerate(f.array(tool, "functionDeclarations", f"tools.{index}") or []):
            path = f"tools.{index}.functionDeclarations.{decl_index}"
            decl = camel(f.expect_object(decl, path))
            schema = decl.get("parametersJsonSchema", decl.get("parameters"))
            tools.append(tool_definition(decl.get("name"), decl.get("description"), schema, path))
    return tools


def _tool_choice(raw: Any) -> common_pb2.ToolChoice | None:
    if raw is None:
        return None
    config = camel(f.obj(camel(f.expect_object(raw, "toolConfig")), "functionCallingConfig", "toolConfig") or {})
    mode = f.string(config, "mode", "toolConfig.functionCallingConfig") or "AUTO"
    modes = {
        "AUTO": common_pb2.TOOL_CHOICE_MODE_AUTO,
        "ANY": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
        "NONE": common_pb2.TOOL_CHOICE_MODE_NONE,
        "VALIDATED": common_pb2.TOOL_CHOICE_MODE_AUTO,
        "MODE_UNSPECIFIED": common_pb2.TOOL_CHOICE_MODE_AUTO,
    }
    if mode not in modes:
        raise f.fail("toolConfig.functionCallingConfig.mode", f"unknown mode {mode!r}")
    return common_pb2.ToolChoice(mode=modes[mode])


def _generation_config(config: JsonObject, request: CanonicalRequest, context: GoogleContext) -> None:
    config, path = camel(config), "generationConfig"
    request.sampling = read_sampling(config, GOOGLE, path)
    if (count := f.integer(config, "candidateCount", path, minimum=1)) is not None and count != 1:
        raise f.fail(f"{path}.candidateCount", "only 1 candidate is supported")
    thinking = camel(f.obj(config, "thinkingConfig", path) or {})
    context.include_thoughts = bool(f.boolean(thinking, "includeThoughts", f"{path}.thinkingConfig"))
    budget = f.integer(thinking, "thinkingBudget", f"{path}.thinkingConfig", minimum=-1)
    if budget == 0:
        request.enable_thinking = False
    elif budget is not None or context.include_thoughts:
        request.enable_thinking = True
