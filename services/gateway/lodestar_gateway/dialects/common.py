"""Conversions several dialects share: tool schemas, tool-call arguments, images, usage numbers."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from lodestar.v1 import common_pb2
from lodestar_gateway.dialects.fields import JsonObject, fail, type_name
from lodestar_gateway.sse import dumps, loads


def tool_definition(name: Any, description: Any, schema: Any, path: str) -> common_pb2.ToolDefinition:
    """A function tool; the JSON schema is kept as compact JSON text (inference renders it)."""
    if not isinstance(name, str) or not name:
        raise fail(f"{path}.name", "expected a non-empty string")
    if description is not None and not isinstance(description, str):
        raise fail(f"{path}.description", f"expected a string, got {type_name(description)}")
    if schema is not None and not isinstance(schema, dict):
        raise fail(f"{path}.parameters", f"expected a JSON schema object, got {type_name(schema)}")
    return common_pb2.ToolDefinition(
        name=name, description=description or "", parameters_json=dumps(schema if schema is not None else {})
    )


def arguments_text(value: Any, path: str) -> str:
    """Tool-call arguments given as an object (Anthropic `input`, Google `args`) as JSON text."""
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise fail(path, f"expected an object, got {type_name(value)}")
    return dumps(value)


def arguments_string(value: Any, path: str) -> str:
    """Tool-call arguments given as JSON text (OpenAI); kept exactly as sent."""
    if value is None:
        return "{}"
    if not isinstance(value, str):
        raise fail(path, f"expected a JSON string, got {type_name(value)}")
    return value


def arguments_object(arguments_json: str) -> JsonObject:
    """Arguments JSON text as an object for dialects that send objects (invalid text -> {})."""
    try:
        value = loads(arguments_json) if arguments_json else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def image_from_url(url: Any, path: str) -> common_pb2.ImagePart:
    """An image given by URL; `data:` URLs are decoded into bytes."""
    if not isinstance(url, str) or not url:
        raise fail(path, "expected a non-empty URL string")
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or ";base64" not in header:
            raise fail(path, "data URLs must be base64 encoded (data:<type>;base64,<data>)")
        return image_from_base64(header[5:].split(";")[0], payload, path)
    return common_pb2.ImagePart(url=url)


def image_from_base64(media_type: Any, data: Any, path: str) -> common_pb2.ImagePart:
    if not isinstance(media_type, str):
        raise fail(path, "image media type must be a string")
    if not isinstance(data, str):
        raise fail(path, "image data must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise fail(path, "image data is not valid base64") from error
    return common_pb2.ImagePart(media_type=media_type, data=raw)


def image_url(image: common_pb2.ImagePart) -> str:
    """The URL form of an image (data: URL for bytes)."""
    if image.WhichOneof("source") == "data":
        return f"data:{image.media_type};base64,{base64.b64encode(image.data).decode()}"
    return image.url


def encode_reasoning(text: str) -> str:
    """OpenAI `encrypted_content` / opaque signatures: lodestar encodes the reasoning text itself."""
    return "lodestar:" + base64.b64encode(text.encode()).decode()


def decode_reasoning(value: str) -> str | None:
    """The reasoning text inside a value made by `encode_reasoning` (None for foreign values)."""
    if not value.startswith("lodestar:"):
        return None
    try:
        return base64.b64decode(value[9:], validate=True).decode()
    except (binascii.Error, ValueError):
        return None
