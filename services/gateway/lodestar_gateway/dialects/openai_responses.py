"""OpenAI Responses (`POST /v1/responses`): parse input items and tools, render the response object, errors.

Harness quirks handled here (HARNESSES.md): Codex sends no `instructions` (its prompt is in `developer`
messages), client item ids (ignored), `include: ["reasoning.encrypted_content"]` (reasoning round-trips
through `encrypted_content`, which lodestar fills with the encoded reasoning text), `store: false`,
`prompt_cache_key`, `{type:"namespace"}` tool groups (flattened to `namespace.name`, calls rendered back
with `namespace`), `custom` tools (a function with one string `input`), and built-in tools such as
`web_search` (dropped: the served model cannot call them). Consecutive assistant-side items (reasoning,
assistant message, function calls) form one canonical assistant message. Streaming is in
`openai_responses_stream`.
"""

from __future__ import annotations

from typing import Any

from lodestar.errors import ContextLengthExceededError, LodestarError
from lodestar.v1 import common_pb2
from lodestar_gateway import canonical as cn
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects import fields as f
from lodestar_gateway.dialects.base import JsonObject, Route
from lodestar_gateway.dialects.common import (
    arguments_string,
    decode_reasoning,
    image_from_url,
    tool_definition,
)
from lodestar_gateway.dialects.openai_chat import OpenAIChat
from lodestar_gateway.dialects.openai_responses_stream import (
    ResponsesContext,
    ResponsesStream,
    output_items,
    render_context,
    response_object,
)
from lodestar_gateway.dialects.sampling import OPENAI_RESPONSES, read_sampling
from lodestar_gateway.sse import dumps

FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "include",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "top_k",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
        "text",
        "truncation",
        "user",
        "background",
        "conversation",
        "prompt",
        "top_logprobs",
        "client_metadata",
        "context_management",
        "seed",
    }
)
_ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "developer": common_pb2.ROLE_DEVELOPER,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
}
CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


class OpenAIResponses:
    """The OpenAI Responses dialect."""

    dialect = common_pb2.DIALECT_OPENAI_RESPONSES
    name = "openai_responses"

    def parse(self, body: Any, route: Route, *, count_tokens: bool = False) -> CanonicalRequest:
        body = f.expect_object(body, "body")
        model = f.string(body, "model", required=True) or ""
        for unsupported in ("previous_response_id", "conversation", "prompt"):
            if body.get(unsupported) is not None:
                raise f.fail(
                    unsupported, "not supported (responses are not stored): send the whole conversation in input"
                )
        context = ResponsesContext()
        tools = _tools(f.array(body, "tools") or [], context)
        messages: list[common_pb2.ChatMessage] = []
        if instructions := f.string(body, "instructions"):
            messages.append(common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=[cn.text_part(instructions)]))
        raw_input = f.req(body, "input")
        if isinstance(raw_input, str):
            messages.append(common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=[cn.text_part(raw_input)]))
        elif isinstance(raw_input, list):
            messages.extend(_items(raw_input, context))
        else:
            raise f.fail("input", f"expected a string or an array of items, got {f.type_name(raw_input)}")
        cn.check_not_empty(messages, "input")
        cn.check_tool_results(messages)
        request = CanonicalRequest(dialect=self.dialect, model=model, messages=messages, tools=tools, render=context)
        request.tool_choice = _tool_choice(body.get("tool_choice"), context)
        request.sampling = read_sampling(body, OPENAI_RESPONSES)
        request.unknown_fields = f.unknown_fields(body, FIELDS)
        request.stream = bool(f.boolean(body, "stream"))
        include = f.string_list(body, "include")
        context.include_encrypted = "reasoning.encrypted_content" in include
        reasoning = f.obj(body, "reasoning") or {}
        effort = f.string(reasoning, "effort", "reasoning")
        if effort is not None:
            request.enable_thinking = effort not in ("none", "minimal")
        for key in (
            "tool_choice",
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "max_output_tokens",
            "metadata",
            "store",
            "truncation",
            "text",
            "reasoning",
            "prompt_cache_key",
        ):
            if key in body:
                context.echo[key] = body[key]
        return request

    def render(self, request: CanonicalRequest, result: CallResult) -> JsonObject:
        context = render_context(request)
        items = output_items(result.message, result.response_id, context)
        return response_object(request, context, result.response_id, result.created, items, result.final)

    def stream(self, request: CanonicalRequest) -> ResponsesStream:
        return ResponsesStream(request)

    def error(self, error: LodestarError) -> tuple[int, JsonObject]:
        if isinstance(error, ContextLengthExceededError):
            message = (
                f"Your input exceeds the context window of this model ({error.prompt_tokens} tokens > "
                f"{error.context_length}). Please adjust your input and try again."
            )
            body = {"message": message, "type": "invalid_request_error", "param": "input"}
            return 400, {"error": {**body, "code": "context_length_exceeded"}}
        return OpenAIChat().error(error)


def _items(raw_items: list[Any], context: ResponsesContext) -> list[common_pb2.ChatMessage]:
    messages: list[common_pb2.ChatMessage] = []
    turn: common_pb2.ChatMessage | None = None

    def assistant_turn(*, new_turn: bool = False) -> common_pb2.ChatMessage:
        nonlocal turn
        if turn is not None and new_turn and (turn.tool_calls or _has_text(turn)):
            messages.append(turn)
            turn = None
        if turn is None:
            turn = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
        return turn

    for index, raw in enumerate(raw_items):
        path = f"input.{index}"
        item = f.expect_object(raw, path)
        kind = f.string(item, "type", path) or ("message" if "role" in item else None)
        if kind == "message":
            role_name = f.string(item, "role", path, required=True) or ""
            role = _ROLES.get(role_name)
            if role is None:
                raise f.fail(f"{path}.role", f"unsupported role {role_name!r}")
            parts = _content(item.get("content"), f"{path}.content")
            if role == common_pb2.ROLE_ASSISTANT:
                assistant_turn(new_turn=False).content.extend(parts)
                continue
            if turn is not None:
                messages.append(turn)
                turn = None
            messages.append(common_pb2.ChatMessage(role=role, content=parts))
        elif kind == "reasoning":
            assistant_turn(new_turn=True).content.append(cn.reasoning_part(_reasoning_text(item, path)))
        elif kind in ("function_call", "custom_tool_call"):
            assistant_turn().tool_calls.append(_tool_call(item, kind, path))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if turn is not None:
                messages.append(turn)
                turn = None
            call_id = f.string(item, "call_id", path, required=True) or ""
            content = _output(item.get("output"), f"{path}.output")
            result = common_pb2.ToolResult(tool_call_id=call_id, content=content)
            messages.append(common_pb2.ChatMessage(role=common_pb2.ROLE_TOOL, tool_result=result))
        else:
            raise f.fail(f"{path}.type", f"unsupported input item type {kind!r}")
    if turn is not None:
        messages.append(turn)
    return messages


def _has_text(message: common_pb2.ChatMessage) -> bool:
    return any(p.WhichOneof("part") != "reasoning" for p in message.content)


def _reasoning_text(item: JsonObject, path: str) -> str:
    encrypted = f.string(item, "encrypted_content", path)
    if encrypted and (decoded := decode_reasoning(encrypted)) is not None:
        return decoded
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = f.array(item, key, path) or []
        texts = [p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == part_type]
        if any(not isinstance(t, str) for t in texts):
            raise f.fail(f"{path}.{key}", "reasoning text must be a string")
        if texts:
            return "".join(texts)
    return ""


def _tool_call(item: JsonObject, kind: str, path: str) -> common_pb2.ToolCall:
    name = f.string(item, "name", path, required=True) or ""
    if namespace := f.string(item, "namespace", path):
        name = f"{namespace}.{name}"
    if kind == "custom_tool_call":
        arguments = dumps({"input": f.string(item, "input", path, required=True) or ""})
    else:
        arguments = arguments_string(item.get("arguments"), f"{path}.arguments")
    call_id = f.string(item, "call_id", path, required=True) or ""
    return common_pb2.ToolCall(id=call_id, name=name, arguments_json=arguments)


def _content(content: Any, path: str) -> list[common_pb2.ContentPart]:
    if isinstance(content, str):
        return [cn.text_part(content)]
    if not isinstance(content, list):
        raise f.fail(path, f"expected a string or an array of content parts, got {f.type_name(content)}")
    parts = []
    for index, raw in enumerate(content):
        part_path = f"{path}.{index}"
        part = f.expect_object(raw, part_path)
        kind = f.string(part, "type", part_path, required=True)
        if kind in ("input_text", "output_text", "text"):
            parts.append(cn.text_part(f.string(part, "text", part_path, required=True) or ""))
        elif kind == "refusal":
            parts.append(cn.text_part(f.string(part, "refusal", part_path, required=True) or ""))
        elif kind == "input_image":
            url = part.get("image_url")
            if url is None:
                raise f.fail(f"{part_path}.image_url", "field required (file ids are not supported)")
            parts.append(common_pb2.ContentPart(image=image_from_url(url, f"{part_path}.image_url")))
        else:
            raise f.fail(f"{part_path}.type", f"unsupported content part type {kind!r}")
    return parts


def _output(output: Any, path: str) -> list[common_pb2.ContentPart]:
    if output is None:
        return []
    if isinstance(output, str):
        return [cn.text_part(output)]
    return _content(output, path)


def _tools(raw_tools: list[Any], context: ResponsesContext) -> list[common_pb2.ToolDefinition]:
    tools: list[common_pb2.ToolDefinition] = []
    for index, raw in enumerate(raw_tools):
        path = f"tools.{index}"
        tool = f.expect_object(raw, path)
        kind = tool.get("type")
        if kind == "namespace":
            namespace = f.string(tool, "name", path, required=True) or ""
            for inner_index, inner in enumerate(f.array(tool, "tools", path, required=True) or []):
                inner_path = f"{path}.tools.{inner_index}"
                definition = _function_tool(f.expect_object(inner, inner_path), inner_path, context)
                if definition is not None:
                    qualified = f"{namespace}.{definition.name}"
                    context.namespaces[qualified] = (namespace, definition.name)
                    if definition.name in context.custom:
                        context.custom.add(qualified)
                    definition.name = qualified
                    tools.append(definition)
        elif (definition := _function_tool(tool, path, context)) is not None:
            tools.append(definition)
    return tools


def _function_tool(tool: JsonObject, path: str, context: ResponsesContext) -> common_pb2.ToolDefinition | None:
    kind = tool.get("type")
    if kind == "function":
        return tool_definition(tool.get("name"), tool.get("description"), tool.get("parameters"), path)
    if kind == "custom":
        definition = tool_definition(tool.get("name"), tool.get("description"), CUSTOM_SCHEMA, path)
        context.custom.add(definition.name)
        return definition
    return None  # built-in tools (web_search, local_shell, ...): the served model cannot call them


def _tool_choice(raw: Any, context: ResponsesContext) -> common_pb2.ToolChoice | None:
    if raw is None:
        return None
    modes = {
        "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
        "none": common_pb2.TOOL_CHOICE_MODE_NONE,
        "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
    }
    if isinstance(raw, str):
        if raw not in modes:
            raise f.fail("tool_choice", f"must be auto, none, required or an object; got {raw!r}")
        return common_pb2.ToolChoice(mode=modes[raw])
    raw = f.expect_object(raw, "tool_choice")
    if raw.get("type") in ("function", "custom"):
        name = f.string(raw, "name", "tool_choice", required=True) or ""
        return common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NAMED, name=name)
    mode = raw.get("mode")
    return common_pb2.ToolChoice(mode=modes.get(mode if isinstance(mode, str) else "auto", modes["auto"]))
