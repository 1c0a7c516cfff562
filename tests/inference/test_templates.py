"""Chat templating and token-faithful continuation, in process, on the tiny model's real tokenizer."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.engines.scripted import render_reply
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import IncrementalDecoder, TextTokenizer
from lodestar_inference.toolcalls import format_for
from tests.inference.helpers import system, text_message, tool, tool_result, user


def assistant(
    text: str = "", *, reasoning: str = "", calls: list[tuple[str, str, dict]] | None = None
) -> common_pb2.ChatMessage:
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
    if reasoning:
        message.content.add(reasoning=common_pb2.ReasoningPart(text=reasoning))
    if text:
        message.content.add(text=common_pb2.TextPart(text=text))
    for call_id, name, arguments in calls or []:
        message.tool_calls.add(id=call_id, name=name, arguments_json=json.dumps(arguments))
    return message


CONVERSATION = [
    system("You are a coding agent."),
    user("Fix the bug."),
    assistant("Looking.", reasoning="Start with ls.", calls=[("c1", "Bash", {"command": "ls"})]),
    tool_result("c1", "main.py"),
    text_message(common_pb2.ROLE_DEVELOPER, "Billing header: x-1"),
    user("Continue."),
]


def test_roles_anywhere_tools_and_calls_render(chat_template: ChatTemplate) -> None:
    text = chat_template.render(CONVERSATION, [tool("Bash")])
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools")
    assert '"name": "Bash"' in text
    assert "<|im_start|>system\nBilling header: x-1<|im_end|>" in text  # a mid-conversation developer message
    assert "<think>\nStart with ls.\n</think>\n\nLooking.\n<tool_call>\n" in text
    assert "<tool_response>\nmain.py\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert chat_template.render(CONVERSATION[:2], enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_prompt_ids_match_transformers_apply_chat_template(tiny_model_dir: Path, chat_template: ChatTemplate) -> None:
    from transformers import AutoTokenizer

    from lodestar_inference.templates import message_dict, tool_dict

    reference = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = reference.apply_chat_template(
        [message_dict(m) for m in CONVERSATION],
        tools=[tool_dict(tool("Bash"))],
        add_generation_prompt=True,
        tokenize=True,
    )
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert list(chat_template.prompt(CONVERSATION, [tool("Bash")]).ids) == list(expected)


def test_special_tokens_are_single_ids(tiny_tokenizer: TextTokenizer) -> None:
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>"):
        ids = tiny_tokenizer.encode(token)
        assert len(ids) == 1, token
    assert tiny_tokenizer.vocab_size == 4096


def test_images_become_a_placeholder(chat_template: ChatTemplate) -> None:
    message = common_pb2.ChatMessage(
        role=common_pb2.ROLE_USER,
        content=[
            common_pb2.ContentPart(text=common_pb2.TextPart(text="look: ")),
            common_pb2.ContentPart(image=common_pb2.ImagePart(media_type="image/png", data=b"\x89PNG")),
        ],
    )
    assert "look: [image]<|im_end|>" in chat_template.render([message])


def test_continuation_keeps_sampled_ids_that_retokenize_differently(
    chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer
) -> None:
    first = [system("sys"), user("Say hello world.")]
    prompt = chat_template.prompt(first)
    answer = "hello world, this function returns"
    # The model sampled the answer one character at a time: valid ids, but not what encode() produces.
    sampled = [tiny_tokenizer.encode(ch)[0] for ch in answer]
    assert tiny_tokenizer.decode(sampled) == answer
    assert sampled != tiny_tokenizer.encode(answer)
    eos = tiny_tokenizer.token_id("<|im_end|>")
    tokens = [*prompt.ids, *sampled, eos]
    messages = [*first, assistant(answer), user("Again.")]
    naive = chat_template.prompt(messages).ids
    assert list(naive[: len(tokens)]) != tokens  # re-tokenizing the history loses the sampled ids
    cont = chat_template.prompt(messages, continuation=inference_pb2.Continuation(token_ids=tokens, message_count=3))
    assert cont.continuation_used
    assert cont.continued_tokens == len(tokens)
    assert list(cont.ids[: len(tokens)]) == tokens
    suffix = tiny_tokenizer.decode(cont.ids[len(tokens) :], skip_special_tokens=False)
    assert suffix == "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    # Same text as the naive rendering: only the ids of the model's own turn differ.
    assert tiny_tokenizer.decode(cont.ids, skip_special_tokens=False) == tiny_tokenizer.decode(
        naive, skip_special_tokens=False
    )


def test_continuation_closes_a_truncated_turn(chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer) -> None:
    first = [user("Count.")]
    tokens = [*chat_template.prompt(first).ids, *tiny_tokenizer.encode("one two")]  # stopped by length: no eos
    messages = [*first, assistant("one two"), user("More.")]
    cont = chat_template.prompt(messages, continuation=inference_pb2.Continuation(token_ids=tokens, message_count=2))
    assert cont.continuation_used
    assert cont.ids[len(tokens)] == tiny_tokenizer.token_id("<|im_end|>")
    assert list(cont.ids[: len(tokens)]) == tokens


def test_continuation_over_tool_results(chat_template: ChatTemplate, tiny_tokenizer: TextTokenizer) -> None:
    first = CONVERSATION[:2]
    call = assistant(calls=[("c1", "Bash", {"command": "ls"})])
    reply = render_reply(
        {"tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]}, format_for("hermes"), ["Bash"], ""
    )
    tokens = [
        *chat_template.prompt(first, [tool("Bash")]).ids,
        *tiny_tokenizer.encode(reply),
        tiny_tokenizer.token_id("<|im_end|>"),
    ]
    messages = [*first, call, tool_result("c1", "main.py")]
    cont = chat_template.prompt(
        messages, [tool("Bash")], continuation=inference_pb2.Continuation(token_ids=tokens, message_count=3)
    )
    full = chat_template.prompt(messages, [tool("Bash")])
    assert cont.continuation_used
    assert cont.ids == full.ids  # the scripted reply is the template's own rendering of the call


@pytest.mark.parametrize("count", [0, 2, 3, 9])
def test_continuation_that_does_not_apply_renders_everything(chat_template: ChatTemplate, count: int) -> None:
    messages = [user("a"), assistant("b"), user("c")]
    cont = inference_pb2.Continuation(token_ids=[1, 2, 3], message_count=count)  # 2 is fine only for index 1
    prompt = chat_template.prompt(messages, continuation=cont)
    assert prompt.continuation_used == (count == 2)
    if count != 2:
        assert prompt.ids == chat_template.prompt(messages).ids


def test_template_that_rewrites_old_turns_still_continues(tiny_tokenizer: TextTokenizer) -> None:
    # Like Qwen3: reasoning of assistant turns before the last user message is dropped when re-rendered.
    source = (
        "{%- set last = (messages | selectattr('role', 'equalto', 'user') | list | length) - 1 %}"
        "{%- set ns = namespace(users=-1) %}"
        "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.users = ns.users + 1 %}{%- endif %}"
        "{{- '<|im_start|>' + m.role + '\\n' }}"
        "{%- if m.role == 'assistant' and m.reasoning_content and ns.users == last %}"
        "{{- '<think>' + m.reasoning_content + '</think>' }}{%- endif %}"
        "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    template = ChatTemplate(dataclasses.replace(tiny_tokenizer, chat_template=source))
    first = [user("q1")]
    tokens = [
        *template.prompt(first).ids,
        *tiny_tokenizer.encode("<think>r</think>a1"),
        tiny_tokenizer.token_id("<|im_end|>"),
    ]
    messages = [*first, assistant("a1", reasoning="r"), user("q2")]
    assert "<think>r</think>" in template.render(messages[:2], add_generation_prompt=False)
    assert "<think>" not in template.render(messages)  # the old reasoning is gone from the re-rendering
    cont = template.prompt(messages, continuation=inference_pb2.Continuation(token_ids=tokens, message_count=2))
    assert cont.continuation_used
    assert (
        tiny_tokenizer.decode(cont.ids[len(tokens) :], skip_special_tokens=False)
        == "\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"
    )


def test_empty_chat_is_invalid(chat_template: ChatTemplate) -> None:
    with pytest.raises(InvalidArgumentError):
        chat_template.prompt([])


def test_incremental_decoder_never_splits_characters(tiny_tokenizer: TextTokenizer) -> None:
    text = "naïve café — 日本語 ✓ done"
    ids = tiny_tokenizer.encode(text)
    decoder = IncrementalDecoder(tiny_tokenizer)
    pieces = [decoder.add([token]) for token in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


@settings(max_examples=150, deadline=None)
@given(
    text=st.lists(st.sampled_from([*"ab \n{}", "é", "日本", "✓", "—", "<tool_call>"]), max_size=30).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
    drop=st.integers(min_value=0, max_value=2),
)
def test_incremental_decoder_text_equals_one_decode_however_ids_arrive(
    tiny_tokenizer: TextTokenizer, text: str, cuts: list[int], drop: int
) -> None:
    """Ids in any chunks (one chunk: the non-streamed reply), possibly ending inside a character: the text
    after `flush` is the decode of all ids, and `add` never returns part of a character."""
    ids = tiny_tokenizer.encode(text)
    ids = ids[: max(0, len(ids) - drop)]
    bounds = sorted({min(cut, len(ids)) for cut in cuts} | {0, len(ids)})
    decoder = IncrementalDecoder(tiny_tokenizer)
    pieces = [decoder.add(ids[start:end]) for start, end in itertools.pairwise(bounds)]
    assert all("\ufffd" not in piece for piece in pieces)
    pieces.append(decoder.flush())
    assert "".join(pieces) == decoder.text == tiny_tokenizer.decode(ids)
    assert decoder.flush() == ""  # nothing is left to flush twice


_PIECE_TEXT = st.lists(st.sampled_from([*'ab \n{}":é日<|>_', "im_end", "tool"]), max_size=12).map("".join)
_SPECIAL = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "\n", ""])


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.tuples(_SPECIAL, _PIECE_TEXT), max_size=8))
def test_segmented_cached_encoding_equals_whole_encoding(
    tiny_tokenizer: TextTokenizer, pieces: list[tuple[str, str]]
) -> None:
    text = "".join(special + body for special, body in pieces)
    assert tiny_tokenizer.segments is not None
    assert tiny_tokenizer.encode(text) == tiny_tokenizer._encode(text)
    assert tiny_tokenizer.encode(text) == tiny_tokenizer._encode(text)  # the second time from the cache
