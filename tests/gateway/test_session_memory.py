"""A gateway node's memory stays flat across many short sessions: 10,000 sessions opened, called once and
closed leave no per-session state in memory (chain links, failure counters, session entries beyond a bounded
memo of recently closed ones), and the process's resident memory does not grow with them."""

from __future__ import annotations

import http.client
import json
import resource
from urllib.parse import urlsplit

import pytest

from lodestar.v1 import gateway_pb2
from tests.gateway.stack import GatewayStack

pytestmark = pytest.mark.slow
SESSIONS = 10_000
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _short_sessions(stack: GatewayStack, count: int) -> gateway_pb2.Session:
    """Run `count` sessions of one call each; return the first one."""
    parts = urlsplit(stack.http_base_url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    stub = stack.stub()
    first: gateway_pb2.Session | None = None
    try:
        for _ in range(count):
            opened = stub.OpenSession(gateway_pb2.OpenSessionRequest(labels={"k": "v"}), timeout=10).session
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {opened.session_key}"}
            connection.request("POST", "/v1/chat/completions", body=BODY, headers=headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            stub.CloseSession(gateway_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=10)
            first = first or opened
    finally:
        connection.close()
    assert first is not None
    return first


def test_memory_is_flat_across_10000_short_sessions(gateway_stack: GatewayStack) -> None:
    gateway_stack.set_script({"replies": [{"text": "ok"}]})
    node = gateway_stack.node
    assert node is not None
    oldest = _short_sessions(gateway_stack, 2_000)  # warm up: caches, allocator arenas, the closed-session memo fills
    warm_rss = _rss_mb()
    _short_sessions(gateway_stack, SESSIONS - 2_000)
    grown_mb = _rss_mb() - warm_rss
    assert len(node.proxy.chains) == 0
    assert node.proxy.unanswered == {}
    assert node.sessions.open_count == 0
    assert len(node.sessions) <= 1024  # the memo of recently closed sessions, not every session
    assert node.proxy.calls_captured == SESSIONS
    assert grown_mb < 16, f"resident memory grew {grown_mb:.1f} MB over {SESSIONS - 2_000} sessions"
    # A long-closed session is still found (in the capture store), by id and by key, with its call.
    for value in (oldest.session_id, oldest.session_key):
        found = gateway_stack.stub().GetSession(gateway_pb2.GetSessionRequest(session_id=value), timeout=10)
        assert found.session.session_id == oldest.session_id
        assert found.session.state == gateway_pb2.SESSION_STATE_CLOSED
        assert [call.sequence for call in found.calls] == [0]
