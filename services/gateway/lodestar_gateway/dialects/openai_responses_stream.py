"""OpenAI Responses rendering: the context parse leaves for it (`ResponsesContext`), output items, the response
object, and the streamed event family.

Stream: response.created, response.in_progress, then per output item output_item.added, its part /
delta / done events (reasoning summary, output_text, function_call_arguments or custom_tool_call_input),
output_item.done, and finally response.completed (always: its response has status "incomplete" when
max_output_tokens cut the answer short; Codex fails a stream that lacks response.completed).
Every event carries an increasing `sequence_number`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lodestar.errors import LodestarError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import sse
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.dialects.base import JsonObject
from lodestar_gateway.dialects.common import arguments_object, encode_reasoning


@dataclass
class ResponsesContext:
    """How canonical tool names map back to Responses items, and what the client asked to include."""

    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    """canonical name -> (namespace, name inside it)"""
    custom: set[str] = field(default_factory=set)
    """canonical names of custom (free-form input) tools"""
    include_encrypted: bool = False
    echo: JsonObject = field(default_factory=dict)
    """Request fields echoed in the response object (tool_choice, temperature...)."""


def render_context(request: CanonicalRequest) -> ResponsesContext:
    """What `OpenAIResponses.parse` recorded in `request.render` (an empty context for another request)."""
    return request.render if isinstance(request.render, ResponsesContext) else ResponsesContext()


def reasoning_item(item_id: str, text: str, context: ResponsesContext) -> JsonObject:
    item: JsonObject = {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    if context.include_encrypted:
        item["encrypted_content"] = encode_reasoning(text)
    return item


def message_item(item_id: str, text: str, status: str = "completed") -> JsonObject:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    )
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, context: ResponsesContext, status: str = "completed"
) -> JsonObject:
    namespace, inner = context.namespaces.get(name, ("", name))
    if name in context.custom:
        item: JsonObject = {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call_id,
            "name": inner,
            "input": str(arguments_object(arguments).get("input", "")),
        }
    else:
        item = {
            "id": item_id,
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": inner,
            "arguments": arguments,
        }
    if namespace:
        item["namespace"] = namespace
    return item


def output_items(message: common_pb2.ChatMessage, response_id: str, context: ResponsesContext) -> list[JsonObject]:
    suffix = response_id.removeprefix("resp_")
    reasoning = "".join(p.reasoning.text for p in message.content if p.WhichOneof("part") == "reasoning")
    text = "".join(p.text.text for p in message.content if p.WhichOneof("part") == "text")
    items: list[JsonObject] = []
    if reasoning:
        items.append(reasoning_item(f"rs_{suffix}", reasoning, context))
    if text:
        items.append(message_item(f"msg_{suffix}", text))
    for index, call in enumerate(message.tool_calls):
        items.append(call_item(f"fc_{suffix}_{index}", call.id, call.name, call.arguments_json, context))
    return items


def response_object(
    request: CanonicalRequest,
    context: ResponsesContext,
    response_id: str,
    created: int,
    output: list[JsonObject],
    final: inference_pb2.GenerateFinal | None,
) -> JsonObject:
    status = "in_progress"
    incomplete = None
    usage = None
    if final is not None:
        status = "completed"
        if final.finish_reason == common_pb2.FINISH_REASON_LENGTH:
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": final.usage.continued_prompt_tokens},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
    body: JsonObject = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": None,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
    }
    body.update(context.echo)
    return body


class ResponsesStream:
    """Renders one streamed response as the Responses event family."""

    content_type = "text/event-stream; charset=utf-8"

    def __init__(self, request: CanonicalRequest) -> None:
        self._request = request
        self._context = render_context(request)
        self._sequence = 0
        self._response_id = ""
        self._suffix = ""
        self._created = 0
        self._items: list[JsonObject] = []
        self._open: str | None = None  # "reasoning" | "text" | "call"
        self._buffer: list[str] = []
        self._call: common_pb2.ToolCall | None = None
        self._tool_index = -1

    def start(self, response_id: str, created: int) -> bytes:
        self._response_id, self._created = response_id, created
        self._suffix = response_id.removeprefix("resp_")
        body = response_object(self._request, self._context, response_id, created, [], None)
        return self._event("response.created", response=body) + self._event("response.in_progress", response=body)

    def delta(self, delta: inference_pb2.GenerateDelta) -> bytes:
        out = b""
        if delta.reasoning_text:
            if self._open != "reasoning":
                out += self._close()
                out += self._added({"id": f"rs_{self._suffix}", "type": "reasoning", "summary": []}, "reasoning")
                out += self._event(
                    "response.reasoning_summary_part.added",
                    **self._where(),
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            self._buffer.append(delta.reasoning_text)
            out += self._event(
                "response.reasoning_summary_text.delta", **self._where(), summary_index=0, delta=delta.reasoning_text
            )
        if delta.text:
            if self._open != "text":
                out += self._close()
                out += self._added(message_item(f"msg_{self._suffix}", "", "in_progress"), "text")
                out += self._event(
                    "response.content_part.added",
                    **self._where(),
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            self._buffer.append(delta.text)
            out += self._event(
                "response.output_text.delta", **self._where(), content_index=0, delta=delta.text, logprobs=[]
            )
        for call in delta.tool_calls:
            if self._open != "call" or call.index != self._tool_index:
                out += self._close()
                self._tool_index = call.index
                self._call = common_pb2.ToolCall(id=call.id, name=call.name)
                item = call_item(
                    f"fc_{self._suffix}_{call.index}", call.id, call.name, "", self._context, "in_progress"
                )
                out += self._added(item, "call")
            if call.arguments_delta and self._call is not None:
                self._buffer.append(call.arguments_delta)
                custom = self._call.name in self._context.custom
                if not custom:
                    out += self._event(
                        "response.function_call_arguments.delta", **self._where(), delta=call.arguments_delta
                    )
        return out

    def finish(self, result: CallResult) -> bytes:
        out = self._close()
        body = response_object(
            self._request, self._context, self._response_id, self._created, self._items, result.final
        )
        # Always `response.completed` (its response says "incomplete" when max_output_tokens cut it short):
        # Codex treats a stream without it as a failure and retries, and a truncated answer is a legitimate
        # outcome of a training run, to be returned to the harness.
        return out + self._event("response.completed", response=body)

    def error(self, error: LodestarError) -> bytes:
        body = response_object(self._request, self._context, self._response_id, self._created, self._items, None)
        body.update(status="failed", error={"code": "server_error", "message": error.message})
        return self._event("response.failed", response=body)

    def _event(self, event_type: str, /, **payload: Any) -> bytes:
        frame = sse.event(event_type, {"type": event_type, "sequence_number": self._sequence, **payload})
        self._sequence += 1
        return frame

    def _where(self) -> JsonObject:
        return {"item_id": self._items[-1]["id"], "output_index": len(self._items) - 1}

    def _added(self, item: JsonObject, kind: str) -> bytes:
        self._items.append(item)
        self._open = kind
        self._buffer = []
        return self._event("response.output_item.added", output_index=len(self._items) - 1, item=dict(item))

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        text = "".join(self._buffer)
        where = self._where()
        out = b""
        if self._open == "reasoning":
            part: JsonObject = {"type": "summary_text", "text": text}
            out += self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
            out += self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)
            item = reasoning_item(where["item_id"], text, self._context)
        elif self._open == "text":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out += self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
            item = message_item(where["item_id"], text)
        else:
            call = self._call or common_pb2.ToolCall()
            item = call_item(where["item_id"], call.id, call.name, text, self._context)
            if item["type"] == "custom_tool_call":
                out += self._event("response.custom_tool_call_input.delta", **where, delta=item["input"])
                out += self._event("response.custom_tool_call_input.done", **where, input=item["input"])
            else:
                out += self._event("response.function_call_arguments.done", **where, arguments=text, name=item["name"])
        self._items[-1] = item
        self._open = None
        self._buffer = []
        return out + self._event("response.output_item.done", output_index=where["output_index"], item=item)
