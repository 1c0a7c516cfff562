"""Tool-call formats of model families: how a call is written inside `<tool_call>...</tool_call>`.

- `hermes` (Qwen2.5/Qwen3, Hermes, many others): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- `qwen3_coder` (Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...
  </function>\\n</tool_call>`; string values are raw text, others JSON (typed by the tool's schema).

Each format renders a call (used by the scripted engine, so its replies look like the model's own) and
parses the body of one block (used by `lodestar_inference.assistant`). A body that does not parse raises
`ToolCallParseError`; the caller returns the raw text with a flag instead of failing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ToolCallParseError(ValueError):
    """The text of a tool-call block is not a well-formed call in the model's format."""


@dataclass(frozen=True)
class ParsedToolCall:
    """A tool call as the model wrote it: function name and arguments as a JSON object text."""

    name: str
    arguments_json: str

    def arguments(self) -> Any:
        return json.loads(self.arguments_json)


ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Tool name -> JSON schema of its arguments (may be empty)."""


class ToolCallFormat(Protocol):
    name: str

    def render(self, call: ParsedToolCall) -> str:
        """The whole `<tool_call>...</tool_call>` block for `call`."""
        ...

    def parse(self, body: str, schemas: ToolSchemas) -> ParsedToolCall:
        """Parse the text between the tags (raises ToolCallParseError)."""
        ...


def _arguments_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ToolCallParseError("arguments are not JSON") from error
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ToolCallParseError("arguments are not a JSON object")
    return raw


class HermesFormat:
    """`{"name": ..., "arguments": {...}}` inside the tags."""

    name = "hermes"

    def render(self, call: ParsedToolCall) -> str:
        arguments = json.dumps(_arguments_object(call.arguments_json), ensure_ascii=False)
        name = json.dumps(call.name, ensure_ascii=False)
        return f'{OPEN_TAG}\n{{"name": {name}, "arguments": {arguments}}}\n{CLOSE_TAG}'

    def parse(self, body: str, schemas: ToolSchemas) -> ParsedToolCall:
        try:
            payload = json.loads(body.strip())
        except json.JSONDecodeError as error:
            raise ToolCallParseError("tool call is not JSON") from error
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
            raise ToolCallParseError("tool call has no name")
        arguments = _arguments_object(payload.get("arguments", payload.get("parameters")))
        return ParsedToolCall(payload["name"], json.dumps(arguments, ensure_ascii=False))


_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    declared = (schema or {}).get("type")
    if declared == "string" or (isinstance(declared, list) and "string" in declared):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


class Qwen3CoderFormat:
    """`<function=NAME><parameter=KEY>VALUE</parameter>...</function>` inside the tags."""

    name = "qwen3_coder"

    def render(self, call: ParsedToolCall) -> str:
        lines = [OPEN_TAG, f"<function={call.name}>"]
        for key, value in _arguments_object(call.arguments_json).items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines += [f"<parameter={key}>", text, "</parameter>"]
        lines += ["</function>", CLOSE_TAG]
        return "\n".join(lines)

    def parse(self, body: str, schemas: ToolSchemas) -> ParsedToolCall:
        match = _FUNCTION.match(body)
        if match is None:
            raise ToolCallParseError("tool call has no <function=...> element")
        name = match.group(1).strip()
        inner = match.group(2)
        properties = (schemas.get(name) or {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for key, raw in _PARAMETER.findall(inner):
            arguments[key.strip()] = _typed_value(_strip_one_newline(raw), properties.get(key.strip()))
        if _PARAMETER.sub("", inner).strip():
            raise ToolCallParseError("tool call has text outside <parameter> elements")
        return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


FORMATS: dict[str, ToolCallFormat] = {"hermes": HermesFormat(), "qwen3_coder": Qwen3CoderFormat()}


def format_for(name: str, chat_template: str | None = None) -> ToolCallFormat:
    """The format named `name`; "auto" picks it from the chat template (XML `<function=` or hermes)."""
    if name == "auto":
        name = "qwen3_coder" if chat_template and "<function=" in chat_template else "hermes"
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r} (known: {sorted(FORMATS)})") from None


def schemas_of(tools: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Mapping[str, Any]]:
    """Name -> schema mapping from (name, schema) pairs."""
    return dict(tools)
