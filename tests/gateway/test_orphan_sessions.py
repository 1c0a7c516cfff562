"""Sessions a node's lifecycle opened are closed when the node restarts: their attempts died with the earlier
process (rollout requeues them), so their keys must stop working. Sessions opened through OpenSession by a
client stay open across a restart."""

from __future__ import annotations

from lodestar.v1 import gateway_pb2
from lodestar_gateway.node.stages import ATTEMPT_LABEL
from tests.gateway.http import post
from tests.gateway.stack import GatewayStack

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_restart_closes_the_sessions_of_dead_attempts(gateway_stack: GatewayStack) -> None:
    gateway_stack.set_script({"replies": [{"text": "ok"}]})
    attempt = gateway_stack.open_session(**{ATTEMPT_LABEL: "run-1-g0-s0", "attempt": "1"})
    client = gateway_stack.open_session(test="client")
    url = gateway_stack.http_base_url
    assert post(url, "/v1/chat/completions", BODY, key=attempt.key).status == 200

    gateway_stack.restart_gateway()

    refused = post(gateway_stack.http_base_url, "/v1/chat/completions", BODY, key=attempt.key)
    assert refused.status == 401
    assert b"closed" in refused.body
    assert gateway_stack.get_session(attempt.session_id).session.state == gateway_pb2.SESSION_STATE_CLOSED
    assert post(gateway_stack.http_base_url, "/v1/chat/completions", BODY, key=client.key).status == 200
