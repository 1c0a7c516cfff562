"""Generated text -> assistant message (reasoning, answer text, tool calls), whole or while streaming.

`AssistantParser.update(text, final)` takes the decoded completion text so far and returns what became
certain since the last call: reasoning text, answer text and tool calls that completed. Text that might
still turn out to be markup (a partial `<tool_call>` or `</think>`, an open tool-call block) or trailing
whitespace is held back, so the concatenation of all deltas equals the final message exactly.

Layout understood (Qwen3 style): an optional reasoning block at the start (`<think>...</think>`, or
reasoning from the first token when the prompt already opened `<think>`), then answer text interleaved
with `<tool_call>...</tool_call>` blocks. A block whose body does not parse in the model's tool-call
format, or that is still open when generation ends, is kept as answer text and flags `parse_error`.
With `parse_tool_calls=False` (the request's tool_choice is "none") all of it is answer text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.inference.toolcalls import (
    CLOSE_TAG,
    OPEN_TAG,
    ParsedToolCall,
    ToolCallFormat,
    ToolCallParseError,
    ToolSchemas,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass
class ParsedAssistant:
    """An assistant message parsed from model text."""

    reasoning: str = ""
    text: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    parse_error: bool = False


@dataclass
class AssistantDelta:
    """What became certain in one update."""

    reasoning: str = ""
    text: str = ""
    tool_calls: list[tuple[int, ParsedToolCall]] = field(default_factory=list)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`.

    Only suffixes that start with the marker's first character can be one: usually none is in the window
    of the last len(marker) - 1 characters, and one `find` settles it (this runs on every streamed delta)."""
    if not marker:
        return 0
    index = text.find(marker[0], max(0, len(text) - len(marker) + 1))
    while index >= 0:
        if marker.startswith(text[index:]):
            return len(text) - index
        index = text.find(marker[0], index + 1)
    return 0


def _stable(text: str, markers: tuple[str, ...], final: bool) -> str:
    """`text` minus what may still change: a partial marker and trailing whitespace (unless final)."""
    if final:
        return text.rstrip()
    hold = max((_partial_suffix(text, marker) for marker in markers), default=0)
    return text[: len(text) - hold].rstrip()


class AssistantParser:
    """Incremental parser of one generation (see the module docstring)."""

    def __init__(
        self,
        fmt: ToolCallFormat,
        schemas: ToolSchemas,
        *,
        starts_in_reasoning: bool = False,
        parse_tool_calls: bool = True,
    ) -> None:
        self._fmt = fmt
        self._parse_tool_calls = parse_tool_calls
        self._schemas = schemas
        self._starts_in_reasoning = starts_in_reasoning
        self._sent_reasoning = 0
        self._sent_text = 0
        self._sent_calls = 0
        self.result = ParsedAssistant()

    def update(self, text: str, *, final: bool = False) -> AssistantDelta:
        """Parse the completion text so far; return the newly certain parts."""
        parsed = self._parse(text, final)
        delta = AssistantDelta(
            reasoning=parsed.reasoning[self._sent_reasoning :],
            text=parsed.text[self._sent_text :],
            tool_calls=[(index, call) for index, call in enumerate(parsed.tool_calls) if index >= self._sent_calls],
        )
        self._sent_reasoning = len(parsed.reasoning)
        self._sent_text = len(parsed.text)
        self._sent_calls = len(parsed.tool_calls)
        self.result = parsed
        return delta

    def _split_reasoning(self, text: str, final: bool) -> tuple[str, str | None]:
        """(reasoning, rest); rest is None while the reasoning block is still open."""
        if self._starts_in_reasoning:
            body = text
        else:
            stripped = text.lstrip()
            if not stripped.startswith(THINK_OPEN):
                if not final and THINK_OPEN.startswith(stripped):
                    return "", None  # too early to tell whether a reasoning block starts
                return "", text
            body = stripped[len(THINK_OPEN) :]
        end = body.find(THINK_CLOSE)
        if end < 0:
            return _stable(body.lstrip(), (THINK_CLOSE,), final), (None if not final else "")
        return body[:end].strip(), body[end + len(THINK_CLOSE) :]

    def _parse(self, text: str, final: bool) -> ParsedAssistant:
        reasoning, rest = self._split_reasoning(text, final)
        parsed = ParsedAssistant(reasoning=reasoning)
        if rest is None:
            return parsed
        if not self._parse_tool_calls:  # tool_choice "none": markup is plain text, never a call
            parsed.text = _stable(rest.lstrip(), (), final)
            return parsed
        pieces: list[str] = []
        position = 0
        while True:
            start = rest.find(OPEN_TAG, position)
            if start < 0:
                pieces.append(rest[position:])
                break
            pieces.append(rest[position:start])
            end = rest.find(CLOSE_TAG, start)
            if end < 0:
                if final:  # an unterminated block: the model stopped mid-call
                    pieces.append(rest[start:])
                    parsed.parse_error = True
                break
            block_end = end + len(CLOSE_TAG)
            try:
                parsed.tool_calls.append(self._fmt.parse(rest[start + len(OPEN_TAG) : end], self._schemas))
            except ToolCallParseError:
                pieces.append(rest[start:block_end])
                parsed.parse_error = True
            position = block_end
        open_block = not final and rest.find(OPEN_TAG, position) >= 0
        joined = "".join(pieces).lstrip()
        parsed.text = joined.rstrip() if open_block else _stable(joined, (OPEN_TAG,), final)
        return parsed
