"""The one canonical-chat -> OpenAI-dict conversion, in both of its uses (templates and SFT export)."""

from __future__ import annotations

import pytest

from lodestar.chat_json import message_dict, tool_dict
from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2


def _assistant_with_call(arguments: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(
        role=common_pb2.ROLE_ASSISTANT,
        content=[
            common_pb2.ContentPart(reasoning=common_pb2.ReasoningPart(text="think")),
            common_pb2.ContentPart(text=common_pb2.TextPart(text="ok")),
        ],
        tool_calls=[common_pb2.ToolCall(id="c1", name="bash", arguments_json=arguments)],
    )


def test_arguments_stay_the_models_json_text_for_export_and_are_decoded_for_templates() -> None:
    message = _assistant_with_call('{"cmd": "ls"}')
    wire = message_dict(message)
    assert wire == {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "think",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}],
    }
    assert message_dict(message, parse_arguments=True)["tool_calls"][0]["function"]["arguments"] == {"cmd": "ls"}
    # arguments that are not JSON are kept as the text the model wrote, in both forms
    assert (
        message_dict(_assistant_with_call("{oops"), parse_arguments=True)["tool_calls"][0]["function"]["arguments"]
        == "{oops"
    )


def test_tool_results_images_and_missing_roles() -> None:
    result = common_pb2.ChatMessage(
        role=common_pb2.ROLE_TOOL,
        tool_result=common_pb2.ToolResult(
            tool_call_id="c1",
            name="bash",
            content=[
                common_pb2.ContentPart(text=common_pb2.TextPart(text="a")),
                common_pb2.ContentPart(image=common_pb2.ImagePart(media_type="image/png", data=b"x")),
            ],
        ),
    )
    assert message_dict(result) == {"role": "tool", "content": "a", "tool_call_id": "c1", "name": "bash"}
    assert message_dict(result, image_placeholder="[image]")["content"] == "a[image]"
    with pytest.raises(InvalidArgumentError, match="no role"):
        message_dict(common_pb2.ChatMessage())


def test_tool_definitions() -> None:
    bare = tool_dict(common_pb2.ToolDefinition(name="t"))
    assert bare == {"type": "function", "function": {"name": "t", "parameters": {"type": "object", "properties": {}}}}
    described = tool_dict(common_pb2.ToolDefinition(name="t", description="d", parameters_json='{"type": "object"}'))
    assert described["function"] == {"name": "t", "description": "d", "parameters": {"type": "object"}}
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        tool_dict(common_pb2.ToolDefinition(name="t", parameters_json="{"))
