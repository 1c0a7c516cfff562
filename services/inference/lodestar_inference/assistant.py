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

from lodestar_inference.toolcalls import (
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
    """Incremental parser of one generation (see the module docstring).

    The text only grows between updates, so what is settled stays parsed: the reasoning block once it
    closed, and the answer up to the end of the last complete tool-call block (its text pieces and its
    calls). An update scans only what came after that, so a long generation with many calls costs a
    constant amount per update besides copying strings, not a re-parse of every block so far."""

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
        self._sent_reasoning = 0
        self._sent_text = 0
        self._sent_calls = 0
        self.result = ParsedAssistant()
        self._body_at: int | None = 0 if starts_in_reasoning else None
        """Where the reasoning block's body starts; None until it is known whether there is one."""
        self._answer_at: int | None = None
        """Where the answer part starts (after the reasoning block, if any), once that is settled."""
        self._reasoning = ""
        self._scanned = 0
        """The answer is settled up to here: the text before it is in `_settled`, its calls in `_calls`."""
        self._settled = ""
        self._calls: list[ParsedToolCall] = []
        self._failed = False
        """A complete block did not parse (its text is in `_settled`)."""
        self._search_from = 0
        """Where the search for the closing tag of the block still open at `_scanned` (or of the reasoning
        block) resumes: a tag can only end in text that came after the previous search."""

    def update(self, text: str, *, final: bool = False) -> AssistantDelta:
        """Parse the completion text so far (the previous text plus what came since); return the newly
        certain parts."""
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

    def _split_reasoning(self, text: str, final: bool) -> tuple[str, int | None]:
        """(reasoning, where the answer starts); None while the reasoning block is still open."""
        if self._answer_at is not None:
            return self._reasoning, self._answer_at
        if self._body_at is None:
            stripped = text.lstrip()
            if not stripped.startswith(THINK_OPEN):
                if not final and THINK_OPEN.startswith(stripped):
                    return "", None  # too early to tell whether a reasoning block starts
                self._answer_at = 0
                return "", 0
            self._body_at = len(text) - len(stripped) + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, max(self._body_at, self._search_from))
        if end < 0:
            self._search_from = len(text) - len(THINK_CLOSE) + 1
            reasoning = _stable(text[self._body_at :].lstrip(), (THINK_CLOSE,), final)
            return reasoning, (len(text) if final else None)
        self._reasoning = text[self._body_at : end].strip()
        self._answer_at = self._scanned = end + len(THINK_CLOSE)
        self._search_from = 0
        return self._reasoning, self._answer_at

    def _parse(self, text: str, final: bool) -> ParsedAssistant:
        reasoning, answer_at = self._split_reasoning(text, final)
        parsed = ParsedAssistant(reasoning=reasoning)
        if answer_at is None:
            return parsed
        self._scanned = max(self._scanned, answer_at)
        if not self._parse_tool_calls:  # tool_choice "none": markup is plain text, never a call
            parsed.text = _stable(text[answer_at:].lstrip(), (), final)
            return parsed
        tail, open_block = self._scan_blocks(text, final)
        joined = (self._settled + tail).lstrip()
        parsed.text = joined.rstrip() if open_block else _stable(joined, (OPEN_TAG,), final)
        parsed.tool_calls = list(self._calls)
        parsed.parse_error = self._failed or (final and open_block)
        return parsed

    def _scan_blocks(self, text: str, final: bool) -> tuple[str, bool]:
        """Settle every tool-call block that completed since the last update; return the unsettled text
        after the last one and whether a block is still open there (at the end: kept as text)."""
        while (start := text.find(OPEN_TAG, self._scanned)) >= 0:
            self._settled += text[self._scanned : start]  # text before a block never changes
            self._scanned = start
            end = text.find(CLOSE_TAG, max(start, self._search_from))
            if end < 0:
                if final:  # an unterminated block: the model stopped mid-call
                    return text[start:], True
                self._search_from = len(text) - len(CLOSE_TAG) + 1
                return "", True
            block_end = end + len(CLOSE_TAG)
            try:
                self._calls.append(self._fmt.parse(text[start + len(OPEN_TAG) : end], self._schemas))
            except ToolCallParseError:
                self._settled += text[start:block_end]
                self._failed = True
            self._scanned = block_end
            self._search_from = 0
        return text[self._scanned :], False
