"""Canonical chat (`lodestar.v1` ChatMessage / ToolDefinition) as OpenAI-shaped dicts, in one place.

Two readers need the same shape: inference renders chat templates from it (transformers' convention:
tool-call `arguments` as a JSON object, an image as a placeholder text) and `lodestar export` writes SFT
data in it (OpenAI Chat wire form: `arguments` as the JSON text the model produced). `message_dict`
serves both through its two options. Bad input (a message without a role, tool parameters that are not a
JSON object) is an InvalidArgumentError naming the problem.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2

ROLE_NAMES = {
    common_pb2.ROLE_SYSTEM: "system",
    common_pb2.ROLE_DEVELOPER: "developer",
    common_pb2.ROLE_USER: "user",
    common_pb2.ROLE_ASSISTANT: "assistant",
    common_pb2.ROLE_TOOL: "tool",
}


def text_of(parts: Sequence[common_pb2.ContentPart], *, image_placeholder: str = "") -> str:
    """The text parts joined; each image part becomes `image_placeholder`; reasoning is left out."""
    pieces: list[str] = []
    for part in parts:
        kind = part.WhichOneof("part")
        if kind == "text":
            pieces.append(part.text.text)
        elif kind == "image":
            pieces.append(image_placeholder)
    return "".join(pieces)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text


def message_dict(
    message: common_pb2.ChatMessage, *, parse_arguments: bool = False, image_placeholder: str = ""
) -> dict[str, Any]:
    """One message as an OpenAI Chat message: `content` text, an assistant's `reasoning_content` and
    `tool_calls`, a tool result's `tool_call_id`. With `parse_arguments`, tool-call arguments are decoded
    from JSON (kept as text when they are not JSON), else they stay the model's JSON text."""
    role = ROLE_NAMES.get(message.role)
    if role is None:
        raise InvalidArgumentError("a message has no role")
    out: dict[str, Any] = {"role": role, "content": text_of(message.content, image_placeholder=image_placeholder)}
    if message.name:
        out["name"] = message.name
    if role == "assistant":
        reasoning = "".join(part.reasoning.text for part in message.content if part.WhichOneof("part") == "reasoning")
        if reasoning:
            out["reasoning_content"] = reasoning
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": _arguments(call.arguments_json) if parse_arguments else call.arguments_json,
                    },
                }
                for call in message.tool_calls
            ]
    if role == "tool":
        out["content"] = text_of(message.tool_result.content, image_placeholder=image_placeholder)
        out["tool_call_id"] = message.tool_result.tool_call_id
        if message.tool_result.name:
            out["name"] = message.tool_result.name
    return out


def tool_schema(tool: common_pb2.ToolDefinition) -> dict[str, Any]:
    """The JSON schema of a tool's arguments (an empty object schema when none was given)."""
    kind = tool.WhichOneof("parameters")
    if kind == "parameters_schema":
        return json_format.MessageToDict(tool.parameters_schema)
    if kind == "parameters_json":
        try:
            schema = json.loads(tool.parameters_json)
        except json.JSONDecodeError as error:
            raise InvalidArgumentError(f"tool {tool.name!r} has parameters that are not JSON") from error
        if not isinstance(schema, dict):
            raise InvalidArgumentError(f"tool {tool.name!r} parameters must be a JSON object")
        return schema
    return {"type": "object", "properties": {}}


def tool_dict(tool: common_pb2.ToolDefinition) -> dict[str, Any]:
    """A tool definition in OpenAI's function form (`description` only when there is one)."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool_schema(tool)
    return {"type": "function", "function": function}
