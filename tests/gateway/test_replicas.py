"""Several inference replicas behind one gateway (services/gateway/replicas.py), all real: two
`lodestar inference serve` processes (the tiny model, really sampled) and a gateway node given both
addresses. Every call of a session reaches one replica and its record says which; SIGKILL one replica and
the sessions it served go on on the other, the call that meets the dead replica moved before its first token
(the harness never sees it), their token chains unbroken."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from openai import OpenAI

from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends
from tests.inference.conftest import serve_inference

pytestmark = pytest.mark.slow
SESSIONS = 8


def _turn(stack: GatewayStack, session: OpenedSession, history: list[dict[str, str]], text: str) -> None:
    client = OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0, timeout=60)
    history.append({"role": "user", "content": text})
    reply = client.chat.completions.create(model="m", messages=history, max_tokens=6)  # type: ignore[arg-type]
    history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def test_sessions_keep_their_replica_and_move_when_it_dies(tiny_model_dir: Path, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack_of:
        replicas = {
            name: stack_of.enter_context(
                serve_inference("transformers", tiny_model_dir, tmp_path, "--replica-id", name, "--max-new-tokens", "8")
            )
            for name in ("ra", "rb")
        }
        addresses = ",".join(replica.address for replica in replicas.values())
        stack = stack_of.enter_context(GatewayStack.start(tmp_path / "gw", None, inference=addresses))
        sessions = [stack.open_session(test="replicas") for _ in range(SESSIONS)]
        histories: list[list[dict[str, str]]] = [[] for _ in sessions]
        for turn in range(3):
            for session, history in zip(sessions, histories, strict=True):
                _turn(stack, session, history, f"turn {turn}")

        served = {s.session_id: {c.inference_replica for c in stack.calls(s.session_id)} for s in sessions}
        assert all(len(names) == 1 for names in served.values()), f"a session's calls changed replica: {served}"
        homes = {s.session_id: next(iter(served[s.session_id])) for s in sessions}
        assert set(homes.values()) == {"ra", "rb"}, f"{SESSIONS} sessions all on one replica: {homes}"

        replicas["ra"].process.kill()
        replicas["ra"].process.wait()
        for session, history in zip(sessions, histories, strict=True):
            _turn(stack, session, history, "after the kill")

        for session in sessions:
            calls = stack.calls(session.session_id)
            assert len(calls) == 4
            assert calls[-1].inference_replica == "rb"
            assert_chain_extends(calls)  # the session's tokens continue on the other replica
        moved = [s for s in sessions if homes[s.session_id] == "ra"]
        assert stack.node is not None
        backend = stack.node.inference
        assert getattr(backend, "failovers", 0) >= 1, "the first call to the dead replica moved"
        assert len(moved) >= 1
