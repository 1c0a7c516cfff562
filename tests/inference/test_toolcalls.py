"""Tool-call formats and the incremental assistant parser (reasoning, text, calls; malformed markup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodestar.v1 import common_pb2
from lodestar_inference.assistant import AssistantParser
from lodestar_inference.engines.scripted import render_reply
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tiny_model import TinyModelSpec, build
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.toolcalls import (
    HermesFormat,
    ParsedToolCall,
    Qwen3CoderFormat,
    ToolCallParseError,
    format_for,
)

SCHEMAS = {
    "Edit": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "line": {"type": "integer"}, "code": {"type": "string"}},
    }
}


def run_parser(text: str, fmt=None, *, split: list[int] | None = None, starts_in_reasoning: bool = False):
    """Feed `text` in pieces (cut at `split`), then finalize; return (concatenated deltas, final result)."""
    parser = AssistantParser(fmt or HermesFormat(), SCHEMAS, starts_in_reasoning=starts_in_reasoning)
    cuts = [*sorted(set(split or [])), len(text)]
    reasoning, answer, calls = "", "", []
    for i, cut in enumerate(cuts):
        delta = parser.update(text[:cut], final=i == len(cuts) - 1)
        reasoning += delta.reasoning
        answer += delta.text
        calls += delta.tool_calls
    return (reasoning, answer, calls), parser.result


def test_hermes_round_trip() -> None:
    fmt = HermesFormat()
    call = ParsedToolCall("Bash", json.dumps({"command": "ls -la", "n": [1, 2]}))
    block = fmt.render(call)
    assert block == '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la", "n": [1, 2]}}\n</tool_call>'
    parsed = fmt.parse(block.removeprefix("<tool_call>").removesuffix("</tool_call>"), {})
    assert parsed.name == "Bash"
    assert json.loads(parsed.arguments_json) == {"command": "ls -la", "n": [1, 2]}


def test_qwen3_coder_round_trip_types_values_by_schema() -> None:
    fmt = Qwen3CoderFormat()
    arguments = {"path": "123", "line": 7, "code": "def f():\n    return 1\n"}
    block = fmt.render(ParsedToolCall("Edit", json.dumps(arguments)))
    assert "<function=Edit>\n<parameter=path>\n123\n</parameter>" in block
    parsed = fmt.parse(block.removeprefix("<tool_call>").removesuffix("</tool_call>"), SCHEMAS)
    assert json.loads(parsed.arguments_json) == arguments  # "123" stays a string, 7 an integer


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        (HermesFormat(), '\n{"name": "Bash", "arguments": {"command": \n'),
        (HermesFormat(), '\n{"arguments": {}}\n'),
        (HermesFormat(), '\n["Bash"]\n'),
        (Qwen3CoderFormat(), "\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n"),
        (Qwen3CoderFormat(), "\nBash(ls)\n"),
    ],
)
def test_malformed_bodies_raise(fmt, body: str) -> None:
    with pytest.raises(ToolCallParseError):
        fmt.parse(body, {})


def test_format_auto_detection() -> None:
    assert format_for("auto", "... <function=example> ...").name == "qwen3_coder"
    assert format_for("auto", "... <tool_call> ...").name == "hermes"


REPLY = (
    "<think>\nplan: list files\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "Read", "arguments": {"path": "a.py"}}\n</tool_call>'
)


def test_parser_splits_reasoning_text_and_calls() -> None:
    (reasoning, answer, calls), result = run_parser(REPLY)
    assert result.reasoning == reasoning == "plan: list files"
    assert result.text == answer == "Let me look."
    assert [c.name for c in result.tool_calls] == ["Bash", "Read"]
    assert [index for index, _ in calls] == [0, 1]
    assert not result.parse_error


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(REPLY)), max_size=30))
def test_streamed_deltas_always_add_up_to_the_final_message(cuts: list[int]) -> None:
    (reasoning, answer, calls), result = run_parser(REPLY, split=cuts)
    assert reasoning == result.reasoning
    assert answer == result.text
    assert [call for _, call in calls] == result.tool_calls


def test_partial_markup_is_held_back() -> None:
    parser = AssistantParser(HermesFormat(), {})
    assert parser.update("Hello <tool_").text == "Hello"
    delta = parser.update('Hello <tool_call>\n{"name": "x", "argu')
    assert delta.text == ""
    assert not delta.tool_calls
    delta = parser.update('Hello <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>', final=True)
    assert [call.name for _, call in delta.tool_calls] == ["x"]


def test_malformed_call_comes_back_as_text_with_the_flag() -> None:
    text = 'Trying.\n<tool_call>\n{"name": "Bash", "arguments": {"command": \n</tool_call>'
    (_, answer, calls), result = run_parser(text, split=list(range(0, len(text), 3)))
    assert result.parse_error
    assert not result.tool_calls
    assert calls == []
    assert result.text == answer == text


def test_unterminated_call_at_the_end_is_text_with_the_flag() -> None:
    text = 'Trying.\n<tool_call>\n{"name": "Bash", "argu'
    (_, answer, _), result = run_parser(text, split=[5, 12, 20])
    assert result.parse_error
    assert result.text == answer == text


def test_reasoning_opened_by_the_prompt() -> None:
    (reasoning, answer, _), result = run_parser(
        "thinking hard\n</think>\n\nAnswer.", starts_in_reasoning=True, split=[3, 9, 16]
    )
    assert result.reasoning == reasoning == "thinking hard"
    assert result.text == answer == "Answer."


def test_qwen3_coder_calls_stream_and_parse() -> None:
    fmt = Qwen3CoderFormat()
    text = "Editing.\n" + fmt.render(ParsedToolCall("Edit", json.dumps({"path": "a.py", "line": 3})))
    (_, answer, calls), result = run_parser(text, fmt, split=list(range(0, len(text), 4)))
    assert answer == result.text == "Editing."
    assert json.loads(result.tool_calls[0].arguments_json) == {"path": "a.py", "line": 3}
    assert len(calls) == 1


@pytest.mark.parametrize("tool_format", ["hermes", "qwen3_coder"])
def test_template_renders_calls_exactly_as_the_model_writes_them(tmp_path: Path, tool_format: str) -> None:
    """What the scripted engine writes for a reply is what the template renders for that assistant message."""
    model_dir = build(tmp_path / tool_format, TinyModelSpec(tool_call_format=tool_format, corpus_bytes=100_000))
    template = ChatTemplate(TextTokenizer.load(model_dir))
    fmt = format_for("auto", template.tokenizer.chat_template)
    assert fmt.name == tool_format
    reply = {"reasoning": "r", "text": "t", "tool_calls": [{"name": "Edit", "arguments": {"path": "a.py", "line": 3}}]}
    written = render_reply(reply, fmt, ["Edit"], "")
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
    message.content.add(reasoning=common_pb2.ReasoningPart(text="r"))
    message.content.add(text=common_pb2.TextPart(text="t"))
    message.tool_calls.add(id="1", name="Edit", arguments_json=json.dumps({"path": "a.py", "line": 3}))
    rendered = template.render([message], add_generation_prompt=False)
    assert rendered == f"<|im_start|>assistant\n{written}<|im_end|>\n"
    parsed = AssistantParser(fmt, SCHEMAS)
    parsed.update(written, final=True)
    assert parsed.result.reasoning == "r"
    assert parsed.result.text == "t"
    assert json.loads(parsed.result.tool_calls[0].arguments_json) == {"path": "a.py", "line": 3}


def test_tool_choice_none_keeps_markup_as_text() -> None:
    parser = AssistantParser(HermesFormat(), SCHEMAS, parse_tool_calls=False)
    streamed = "".join(parser.update(REPLY[:cut]).text for cut in range(0, len(REPLY), 7))
    streamed += parser.update(REPLY, final=True).text
    assert parser.result.reasoning == "plan: list files"
    assert parser.result.text == streamed
    assert parser.result.text.startswith("Let me look.\n<tool_call>")
    assert not parser.result.tool_calls
    assert not parser.result.parse_error


FRAGMENTS = [
    "<think>",
    "</think>",
    "  ",
    "\n\n",
    "Let me look. ",
    "<tool_call>",
    "</tool_call>",
    '\n{"name": "Edit", "arguments": {"path": "a.py", "line": 3, "code": "x = 1"}}\n',
    '{"name": "Bash", "arguments": {"command": ',
    "<tool_",
    "</thi",
    "done.",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), max_size=14),
    st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    st.booleans(),
    st.booleans(),
)
@pytest.mark.slow
def test_an_incremental_parse_equals_the_parse_of_the_whole_text(
    fragments: list[str], cuts: list[int], starts_in_reasoning: bool, parse_tool_calls: bool
) -> None:
    """Whatever the text and however it arrives, the streamed deltas add up to the final message, and the
    final message is what one parse of the whole text gives (the settled state carried between updates
    changes nothing)."""
    text = "".join(fragments)
    streamed = AssistantParser(
        HermesFormat(), SCHEMAS, starts_in_reasoning=starts_in_reasoning, parse_tool_calls=parse_tool_calls
    )
    reasoning, answer, calls = "", "", []
    for cut in [*sorted({min(cut, len(text)) for cut in cuts}), len(text)]:
        delta = streamed.update(text[:cut], final=False)
        reasoning, answer, calls = reasoning + delta.reasoning, answer + delta.text, calls + delta.tool_calls
    delta = streamed.update(text, final=True)
    reasoning, answer, calls = reasoning + delta.reasoning, answer + delta.text, calls + delta.tool_calls
    whole = AssistantParser(
        HermesFormat(), SCHEMAS, starts_in_reasoning=starts_in_reasoning, parse_tool_calls=parse_tool_calls
    )
    whole.update(text, final=True)
    assert streamed.result == whole.result
    assert (reasoning, answer) == (whole.result.reasoning, whole.result.text)
    assert [index for index, _ in calls] == list(range(len(whole.result.tool_calls)))
    assert [call for _, call in calls] == whole.result.tool_calls
