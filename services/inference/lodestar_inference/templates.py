"""Chat templating, in exactly one place: canonical messages + tools -> prompt ids, token-faithfully.

`ChatTemplate.prompt(...)` renders the canonical `lodestar.v1` chat with the model's own Jinja chat
template (the same sandboxed environment and helpers transformers uses) and tokenizes it. With a
`Continuation` (the exact ids of an earlier call: its prompt + sampled ids, covering the first
`message_count` messages) the prompt is those ids, an end-of-turn id if the earlier call did not end
with one, and the tokens of only what the template renders for the new messages (the difference
between rendering the whole chat and rendering the covered messages: whatever follows the covered messages' last
end-of-turn text). What the model produced is never re-tokenized. When the continuation does not apply
(count out of range, last covered message not an assistant message, no new message) the whole chat is
rendered and `continuation_used` is False.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lodestar import chat_json
from lodestar.chat_json import tool_dict
from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.tokenizer import TextTokenizer

IMAGE_PLACEHOLDER = "[image]"


@dataclass(frozen=True)
class Prompt:
    """The ids a generation starts from and how they were obtained."""

    ids: tuple[int, ...]
    continuation_used: bool
    continued_tokens: int
    """How many leading ids came verbatim from the continuation."""
    opens_reasoning: bool
    """The prompt ends inside an opened `<think>` block: generation starts with reasoning."""


def message_dict(message: common_pb2.ChatMessage) -> dict[str, Any]:
    """One canonical message as the dict chat templates expect (transformers' shape: tool-call arguments
    decoded from JSON, an image as a placeholder text)."""
    return chat_json.message_dict(message, parse_arguments=True, image_placeholder=IMAGE_PLACEHOLDER)


def _environment() -> ImmutableSandboxedEnvironment:
    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """Renders canonical chats with one model's template and tokenizer."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._template = _environment().from_string(tokenizer.chat_template)
        eos_text = tokenizer.special_tokens.get("eos_token")
        self._turn_end_text = eos_text or tokenizer.decode(tokenizer.eos_token_ids[:1], skip_special_tokens=False)
        self._turn_end_id = tokenizer.token_id(self._turn_end_text)

    def render(
        self,
        messages: Sequence[common_pb2.ChatMessage],
        tools: Sequence[common_pb2.ToolDefinition] = (),
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> str:
        variables: dict[str, Any] = {
            "messages": [message_dict(message) for message in messages],
            "tools": [tool_dict(tool) for tool in tools] or None,
            "add_generation_prompt": add_generation_prompt,
            **self.tokenizer.special_tokens,
        }
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as error:
            raise InvalidArgumentError(f"the chat cannot be rendered by the model's template: {error}") from error

    def prompt(
        self,
        messages: Sequence[common_pb2.ChatMessage],
        tools: Sequence[common_pb2.ToolDefinition] = (),
        *,
        enable_thinking: bool | None = None,
        continuation: inference_pb2.Continuation | None = None,
    ) -> Prompt:
        """Prompt ids for a generation (see the module docstring)."""
        if not messages:
            raise InvalidArgumentError("the request has no messages")
        full = self.render(messages, tools, enable_thinking=enable_thinking)
        opens = full.rstrip().endswith("<think>")
        if continuation is not None and continuation.token_ids:
            suffix = self._continuation_suffix(messages, tools, full, continuation)
            if suffix is not None:
                head = list(continuation.token_ids)
                if self._turn_end_id is not None and head[-1] not in self.tokenizer.eos_token_ids:
                    head.append(self._turn_end_id)
                ids = (*head, *self.tokenizer.encode(suffix))
                return Prompt(ids, True, len(continuation.token_ids), opens)
        return Prompt(tuple(self.tokenizer.encode(full)), False, 0, opens)

    def _continuation_suffix(
        self,
        messages: Sequence[common_pb2.ChatMessage],
        tools: Sequence[common_pb2.ToolDefinition],
        full: str,
        continuation: inference_pb2.Continuation,
    ) -> str | None:
        """The text the template renders after the covered messages' last end-of-turn, or None."""
        count = continuation.message_count
        if not 0 < count < len(messages) or messages[count - 1].role != common_pb2.ROLE_ASSISTANT:
            return None
        covered = self.render(messages[:count], tools, add_generation_prompt=False)
        # The new messages start after as many turn ends as the covered messages render. Counting (rather
        # than requiring a string prefix) keeps templates that rewrite earlier turns, e.g. Qwen3 dropping
        # old reasoning, usable: the earlier turns come from the continuation ids anyway.
        turns = covered.count(self._turn_end_text)
        if turns == 0:
            return None
        position = -1
        for _ in range(turns):
            position = full.find(self._turn_end_text, position + 1)
            if position < 0:
                return None
        return full[position + len(self._turn_end_text) :]

    def count_tokens(
        self, messages: Sequence[common_pb2.ChatMessage], tools: Sequence[common_pb2.ToolDefinition] = ()
    ) -> int:
        return len(self.prompt(messages, tools).ids)
