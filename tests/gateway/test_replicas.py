"""Several inference replicas behind one gateway (services/gateway/lodestar_gateway/replicas.py), all real: two
`lodestar inference serve` processes (the tiny model, really sampled) and a gateway node given both
addresses. Every call of a session reaches one replica and its record says which; SIGKILL one replica and
the sessions it served go on on the other, the call that meets the dead replica moved before its first token
(the harness never sees it), their token chains unbroken. A streaming call cut by the kill after its first
tokens is not restarted elsewhere: the harness's SDK raises, no record is left for it, and the session's next
call chains to its last answered one on the surviving replica."""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk

from lodestar_gateway.replicas import DOWN_S
from tests.gateway.stack import GatewayStack, OpenedSession, assert_chain_extends
from tests.inference.conftest import ServerProcess, serve_inference

pytestmark = pytest.mark.slow
SESSIONS = 8


def _turn(stack: GatewayStack, session: OpenedSession, history: list[dict[str, str]], text: str) -> None:
    client = OpenAI(base_url=stack.openai_base_url, api_key=session.key, max_retries=0, timeout=60)
    history.append({"role": "user", "content": text})
    reply = client.chat.completions.create(model="m", messages=history, max_tokens=6)  # type: ignore[arg-type]
    history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def _text(chunks: Iterable[ChatCompletionChunk]) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def _read(stream: Iterable[ChatCompletionChunk], events: queue.Queue[ChatCompletionChunk | Exception | None]) -> None:
    """Hand a stream's chunks to `events`, then None at its end or the exception that ended it."""
    try:
        for chunk in stream:
            events.put(chunk)
        events.put(None)
    except Exception as error:
        events.put(error)


def _stream_until_cut(client: OpenAI, history: list[dict[str, str]], replica: ServerProcess) -> int:
    """Stream long answers until one is cut by a SIGKILL of `replica` after its first tokens; the number of
    answers that ended (an early end of turn) before a cut could land, which are recorded and join `history`.

    The replica is frozen (SIGSTOP) at the first sampled token; if the stream then ends, the answer had ended
    before the freeze: the replica is thawed and another call tried. A stream that stalls is the cut."""
    for answered in range(5):
        messages = [*history, {"role": "user", "content": "a long one"}]
        stream = client.chat.completions.create(model="m", messages=messages, max_tokens=4000, stream=True)  # type: ignore[arg-type]
        events: queue.Queue[ChatCompletionChunk | Exception | None] = queue.Queue()
        threading.Thread(target=_read, args=(stream, events), daemon=True).start()
        text, event = "", events.get(timeout=60)
        while isinstance(event, ChatCompletionChunk) and not (text := _text([event])):
            event = events.get(timeout=60)  # the first chunk may carry only the role
        if isinstance(event, ChatCompletionChunk):
            replica.process.send_signal(signal.SIGSTOP)
            try:
                while isinstance(event := events.get(timeout=2.0), ChatCompletionChunk):
                    text += _text([event])
            except queue.Empty:  # frozen mid-answer: the cut
                replica.process.kill()
                replica.process.wait()
                assert isinstance(events.get(timeout=60), openai.APIError), "the harness's SDK raises"
                return answered
            replica.process.send_signal(signal.SIGCONT)
        assert event is None, f"the stream failed before the cut: {event!r}"
        history += [messages[-1], {"role": "assistant", "content": text}]
    raise AssertionError("5 answers ended before a cut could land")


def test_sessions_keep_their_replica_and_move_when_it_dies(tiny_model_dir: Path, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack_of:
        replicas = {
            name: stack_of.enter_context(
                serve_inference(
                    "transformers", tiny_model_dir, tmp_path, "--replica-id", name, "--max-new-tokens", "4000"
                )
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

        # A long streaming call of a session homed on ra, cut by the kill after its first tokens.
        cut = next(index for index, s in enumerate(sessions) if homes[s.session_id] == "ra")
        client = OpenAI(base_url=stack.openai_base_url, api_key=sessions[cut].key, max_retries=0, timeout=60)
        answered = _stream_until_cut(client, histories[cut], replicas["ra"])
        assert len(stack.calls(sessions[cut].session_id)) == 3 + answered, "the cut call left no record"
        time.sleep(DOWN_S + 0.5)  # the cut set ra aside; past that, the next call to it must fail over
        for session, history in zip(sessions, histories, strict=True):
            _turn(stack, session, history, "after the kill")

        for index, session in enumerate(sessions):
            calls = stack.calls(session.session_id)
            assert len(calls) == 4 + (answered if index == cut else 0)
            assert calls[-1].inference_replica == "rb"
            assert_chain_extends(calls)  # the session's tokens continue on the other replica
        moved = [s for s in sessions if homes[s.session_id] == "ra"]
        assert stack.node is not None
        backend = stack.node.inference
        assert getattr(backend, "failovers", 0) >= 1, "the first call to the dead replica moved"
        assert len(moved) >= 1
