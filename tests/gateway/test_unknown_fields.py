"""Unknown top-level request fields: accepted, kept verbatim, counted per dialect and field (default), or
refused in the dialect's shape (`strict_fields`)."""

from __future__ import annotations

import json

import pytest
import structlog

from lodestar.v1 import common_pb2, gateway_pb2
from lodestar_gateway.unknown_fields import UnknownFields
from tests.gateway.cases import VALID, error_message
from tests.gateway.conftest import StackFactory
from tests.gateway.http import post

DIALECT = {
    "anthropic": common_pb2.DIALECT_ANTHROPIC_MESSAGES,
    "chat": common_pb2.DIALECT_OPENAI_CHAT,
    "responses": common_pb2.DIALECT_OPENAI_RESPONSES,
    "google": common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT,
}


def test_unknown_fields_are_accepted_kept_and_counted(gateway_stack_factory: StackFactory) -> None:
    stack = gateway_stack_factory()
    session = stack.open_session()
    for path, body in VALID.values():
        for _ in range(2):
            reply = post(stack.http_base_url, path, {**body, "future_field": {"x": 1}}, key=session.key)
            assert reply.status == 200, reply.body
    path, body = VALID["chat"]
    reply = post(stack.http_base_url, path, {**body, "another_one": True}, key=session.key)
    assert reply.status == 200
    calls = stack.calls(session.session_id)
    assert len(calls) == 9
    assert all(json.loads(call.original_request_json).get("future_field") == {"x": 1} for call in calls[:8])
    status = stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest())
    counts = {(c.dialect, c.field): c.count for c in status.unknown_fields}
    assert counts == {
        **{(DIALECT[name], "future_field"): 2 for name in VALID},
        (common_pb2.DIALECT_OPENAI_CHAT, "another_one"): 1,
    }


@pytest.mark.parametrize("dialect", list(VALID))
def test_strict_fields_refuse_in_the_dialects_shape(gateway_stack_factory: StackFactory, dialect: str) -> None:
    stack = gateway_stack_factory(strict_fields=True)
    session = stack.open_session()
    path, body = VALID[dialect]
    reply = post(stack.http_base_url, path, {**body, "future_field": 1}, key=session.key)
    assert reply.status == 400
    assert "future_field" in error_message(dialect, 400, reply.json())
    assert post(stack.http_base_url, path, body, key=session.key).status == 200
    assert len(stack.calls(session.session_id)) == 1
    assert not stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest()).unknown_fields


def test_logged_once_per_dialect_and_field() -> None:
    fields = UnknownFields()
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            fields.check(common_pb2.DIALECT_OPENAI_CHAT, ["a", "b"])
        fields.check(common_pb2.DIALECT_ANTHROPIC_MESSAGES, ["a"])
        fields.check(common_pb2.DIALECT_ANTHROPIC_MESSAGES, [])
    assert [(log["dialect"], log["field"]) for log in logs] == [
        ("DIALECT_OPENAI_CHAT", "a"),
        ("DIALECT_OPENAI_CHAT", "b"),
        ("DIALECT_ANTHROPIC_MESSAGES", "a"),
    ]
    assert fields.counts()[:2] == [(common_pb2.DIALECT_OPENAI_CHAT, "a", 3), (common_pb2.DIALECT_OPENAI_CHAT, "b", 3)]
