"""`Proxy.take_unanswered`: what the node asks, after the harness exits, to tell a finished session from one whose
calls got no answer (docs/nodes.md "Outcomes"). A call still waiting for inference at that moment counts as
unanswered even before its HTTP handler has been cancelled (the race the lifecycle test cannot pin down: there the
handler's cancellation usually lands first); a call answered meanwhile does not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from lodestar.errors import UnavailableError
from lodestar.v1 import common_pb2, gateway_pb2, inference_pb2
from lodestar_gateway.canonical import CallResult, CanonicalRequest
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.proxy import Proxy
from lodestar_gateway.sessions import SessionEntry
from tests.inference.helpers import user


class HeldInference:
    """Answers "OK" once `release` is set; until then the call waits, as on a replica that hangs."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        self.entered.set()
        await self.release.wait()
        final = inference_pb2.GenerateFinal(
            completion_token_ids=[7], completion_logprobs=[-0.1], finish_reason=common_pb2.FINISH_REASON_STOP
        )
        final.message.role = common_pb2.ROLE_ASSISTANT
        yield inference_pb2.GenerateResponse(final=final)


def _request() -> CanonicalRequest:
    return CanonicalRequest(dialect=common_pb2.DIALECT_OPENAI_CHAT, model="tiny", messages=[user("Shout: hello")])


async def _answer(proxy: Proxy, session: SessionEntry, call_id: str) -> CallResult | None:
    async for event in proxy.call(session, _request(), b"{}", response_id=call_id):
        if isinstance(event, CallResult):
            return event
    return None


async def test_a_call_still_waiting_counts_and_an_answered_one_does_not(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "capture.sqlite")
    await store.open()
    inference = HeldInference()
    proxy = Proxy(inference, store)  # type: ignore[arg-type]
    session = SessionEntry(gateway_pb2.Session(session_id="s-1"))
    try:
        waiting = asyncio.create_task(_answer(proxy, session, "call-1"))
        await asyncio.wait_for(inference.entered.wait(), 10)
        unanswered = proxy.take_unanswered("s-1")  # the harness exited; its handler not yet cancelled
        assert unanswered.failed == 1
        assert "1 call(s) still waiting for inference when the harness finished" in unanswered.last_error
        waiting.cancel()  # the handler's cancellation lands afterwards
        await asyncio.gather(waiting, return_exceptions=True)
        assert proxy.in_flight == {}

        proxy.take_unanswered("s-1")  # forget the cancelled call's own record
        inference.release.set()
        answered = await asyncio.wait_for(_answer(proxy, session, "call-2"), 10)
        assert answered is not None
        assert proxy.take_unanswered("s-1").failed == 0
        assert proxy.in_flight == {}
    finally:
        await store.close()


async def test_a_call_that_failed_counts_once(tmp_path: Path) -> None:
    class DownInference:
        async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[object]:
            raise UnavailableError("no replica")
            yield  # an async generator

    store = CaptureStore(tmp_path / "capture.sqlite")
    await store.open()
    proxy = Proxy(DownInference(), store)  # type: ignore[arg-type]
    session = SessionEntry(gateway_pb2.Session(session_id="s-2"))
    try:
        outcome = await asyncio.gather(_answer(proxy, session, "call-1"), return_exceptions=True)
        assert isinstance(outcome[0], UnavailableError)
        unanswered = proxy.take_unanswered("s-2")
        assert unanswered.failed == 1
        assert unanswered.last_error == "no replica"
        assert proxy.in_flight == {}
    finally:
        await store.close()
