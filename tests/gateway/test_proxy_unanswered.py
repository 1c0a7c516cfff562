"""`Proxy.take_unanswered`: what the node asks, after the harness exits, to tell a finished session from one whose
calls got no answer (docs/nodes.md "Outcomes") and from one that stopped reading an answer streamed to it. A call
still waiting for inference at that moment counts as unanswered even before its HTTP handler has been cancelled
(the race the lifecycle test cannot pin down: there the handler's cancellation usually lands first); a call
answered meanwhile does not."""

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


def _request(*, stream: bool = False) -> CanonicalRequest:
    return CanonicalRequest(
        dialect=common_pb2.DIALECT_OPENAI_CHAT, model="tiny", messages=[user("Shout: hello")], stream=stream
    )


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


class StreamingInference:
    """Streams one token delta every `delay_s`, `count` of them, then stalls until cancelled (a generation that
    stopped sending: the swap-during-prefill hang of the first chaos hour)."""

    def __init__(self, count: int, delay_s: float = 0.02) -> None:
        self.count, self.delay_s = count, delay_s

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        for token in range(self.count):
            await asyncio.sleep(self.delay_s)
            yield inference_pb2.GenerateResponse(delta=inference_pb2.GenerateDelta(token_ids=[token], text="ab"))
        await asyncio.Event().wait()


async def _read(proxy: Proxy, session: SessionEntry, call_id: str, *, stream: bool, deltas: int) -> None:
    """A caller that reads `deltas` deltas of its answer, then stops reading and goes away (the generator is
    closed, as when the HTTP handler of a client that hung up is cancelled)."""
    calls = proxy.call(session, _request(stream=stream), b"{}", response_id=call_id)
    for _ in range(deltas):
        await anext(calls)
    await calls.aclose()


async def _proxy(tmp_path: Path, inference: object, **kwargs: float) -> tuple[Proxy, CaptureStore]:
    store = CaptureStore(tmp_path / "capture.sqlite")
    await store.open()
    return Proxy(inference, store, **kwargs), store  # type: ignore[arg-type]


async def test_a_caller_that_stops_reading_a_flowing_stream_abandoned_it(tmp_path: Path) -> None:
    """Gemini CLI's loop detection cancels a stream whose text repeats and exits 0: that is the harness's choice
    (and so the policy's), never an outage to retry. Left as a failure, a policy could turn its low rewards
    into INFRA_FAILED (retried, then dropped) by looping."""
    proxy, store = await _proxy(tmp_path, StreamingInference(count=100))
    session = SessionEntry(gateway_pb2.Session(session_id="s-3"))
    try:
        await _read(proxy, session, "call-1", stream=True, deltas=3)
        unanswered = proxy.take_unanswered("s-3")
        assert (unanswered.failed, unanswered.abandoned) == (0, 1)
        assert proxy.streams_abandoned == 1
        assert proxy.in_flight == {}
        assert await store.calls("s-3") == [], "an abandoned answer leaves no record"
    finally:
        await store.close()


async def test_a_caller_that_leaves_a_stalled_or_unstreamed_answer_gave_up(tmp_path: Path) -> None:
    """The same departure is a failure when nothing reached the caller for `stall_s` (a stalled generation) or
    when the answer was not streamed to it at all (it waited for the whole answer: its own timeout)."""
    proxy, store = await _proxy(tmp_path, StreamingInference(count=2), stall_s=0.3)
    stalled = SessionEntry(gateway_pb2.Session(session_id="s-4"))
    unstreamed = SessionEntry(gateway_pb2.Session(session_id="s-5"))
    try:
        reading = asyncio.create_task(_read(proxy, stalled, "call-1", stream=True, deltas=3))
        await asyncio.sleep(0.6)  # two deltas, then nothing for longer than stall_s
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        assert proxy.take_unanswered("s-4") == (1, "the caller went away before the answer", False, 0)

        await _read(proxy, unstreamed, "call-2", stream=False, deltas=2)
        assert proxy.take_unanswered("s-5") == (1, "the caller went away before the answer", False, 0)
        assert proxy.streams_abandoned == 0
    finally:
        await store.close()


async def test_a_flowing_stream_still_open_when_the_harness_finished_was_abandoned(tmp_path: Path) -> None:
    """The node may ask before the handler of a caller that hung up is cancelled: a call whose stream still
    flowed then is abandoned; one that stalled, or was never streamed, is still waiting (failed)."""
    proxy, store = await _proxy(tmp_path, StreamingInference(count=2), stall_s=0.3)
    session = SessionEntry(gateway_pb2.Session(session_id="s-6"))
    try:
        calls = proxy.call(session, _request(stream=True), b"{}", response_id="call-1")
        await anext(calls)
        await anext(calls)  # the second delta reached the caller
        flowing = proxy.take_unanswered("s-6")
        assert (flowing.failed, flowing.abandoned) == (0, 1)
        await asyncio.sleep(0.5)  # no third delta: stalled
        stalled = proxy.take_unanswered("s-6")
        assert (stalled.failed, stalled.abandoned) == (1, 0)
        assert "1 call(s) still waiting for inference" in stalled.last_error
        await calls.aclose()
        proxy.take_unanswered("s-6")
        assert proxy.in_flight == {}
    finally:
        await store.close()
