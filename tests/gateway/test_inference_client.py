"""The gateway's inference client (`GrpcInference` over `GenerateStreams`) against stand-in servers: a
unit test of its stream logic (retry of UNAVAILABLE before a response, a stream that breaks mid-generation,
cancellation sent when the consumer leaves, the fallback to Generate for a server without GenerateMany).
The real servers are in tests/inference/test_generate_many.py and every gateway test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from lodestar.errors import InternalError, UnavailableError
from lodestar.grpc.server import GrpcServer, service_name
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_gateway.inference_client import GrpcInference
from lodestar_inference.multiplex import Multiplexer
from tests.waiting import eventually

REQUEST = inference_pb2.GenerateRequest(request_id="r", stream=True)


def _delta(n: int) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(delta=inference_pb2.GenerateDelta(token_ids=[n]))


def _final() -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(final=inference_pb2.GenerateFinal(completion_token_ids=[1, 2]))


class StandIn(inference_pb2_grpc.InferenceServiceServicer):
    """Scripted GenerateMany behaviour per stream, in order; records the requests it read."""

    def __init__(self, streams: list[Callable[[Any, Any], AsyncIterator[inference_pb2.GenerateManyResponse]]]) -> None:
        self.streams = streams
        self.opened = 0
        self.received: list[inference_pb2.GenerateManyRequest] = []
        self.generate_calls = 0

    async def GenerateMany(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
        behaviour = self.streams[min(self.opened, len(self.streams) - 1)]
        self.opened += 1
        async for response in behaviour(self._recording(request_iterator), context):
            yield response

    async def _recording(self, requests: Any) -> AsyncIterator[inference_pb2.GenerateManyRequest]:
        async for request in requests:
            self.received.append(request)
            yield request

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateResponse]:
        self.generate_calls += 1
        yield _delta(5)
        yield _final()


def tagged(tag: int, response: inference_pb2.GenerateResponse) -> inference_pb2.GenerateManyResponse:
    return inference_pb2.GenerateManyResponse(
        responses=[inference_pb2.TaggedGenerateResponse(tag=tag, response=response)]
    )


async def answers(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    """Every generate: one delta and the final; a cancel is recorded only."""
    async for request in requests:
        if request.WhichOneof("action") == "generate":
            yield tagged(request.tag, _delta(request.tag))
            yield tagged(request.tag, _final())


async def unavailable_tags(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    """Refuses each tag as a starting server does (the stream stays up)."""
    async for request in requests:
        error = inference_pb2.GenerateError(code=grpc.StatusCode.UNAVAILABLE.value[0], message="starting")
        yield inference_pb2.GenerateManyResponse(
            responses=[inference_pb2.TaggedGenerateResponse(tag=request.tag, error=error)]
        )


async def breaks_after_a_delta(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    async for request in requests:
        yield tagged(request.tag, _delta(1))
        await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")


async def ends_at_once(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    """Ends the stream before reading anything, with a code that is not UNAVAILABLE."""
    await context.abort(grpc.StatusCode.INTERNAL, "Received RST_STREAM")
    yield inference_pb2.GenerateManyResponse()  # pragma: no cover (makes this an async generator)


async def answers_once_then_breaks(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    """Answers the first generation; at the next the whole stream ends with INTERNAL, as the stream of a server
    SIGKILLed under it can ("Internal error from Core", seen in tests/gateway/test_replica_restart.py)."""
    answered = False
    async for request in requests:
        if request.WhichOneof("action") != "generate":
            continue
        if answered:
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        yield tagged(request.tag, _delta(request.tag))
        yield tagged(request.tag, _final())
        answered = True


async def silent(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    """Reads requests, answers one delta per generate, never a final (a long generation)."""
    async for request in requests:
        if request.WhichOneof("action") == "generate":
            yield tagged(request.tag, _delta(9))


async def internal(requests: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
    async for request in requests:
        error = inference_pb2.GenerateError(code=grpc.StatusCode.INTERNAL.value[0], message="a bug: /srv/x.py")
        yield inference_pb2.GenerateManyResponse(
            responses=[inference_pb2.TaggedGenerateResponse(tag=request.tag, error=error)]
        )


@contextlib.asynccontextmanager
async def client_of(servicer: inference_pb2_grpc.InferenceServiceServicer) -> AsyncIterator[GrpcInference]:
    """The gateway's client connected to `servicer` served by a real gRPC server."""
    server = GrpcServer("stand-in", port=0, drain_seconds=0.5)
    server.add_service(
        inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        servicer,
        service_name(inference_pb2.DESCRIPTOR, "InferenceService"),
    )
    await server.start()
    client = GrpcInference(f"127.0.0.1:{server.port}", timeout_s=10)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(0)


async def run(client: GrpcInference) -> list[inference_pb2.GenerateResponse]:
    return [response async for response in client.generate(REQUEST)]


async def test_generations_share_one_stream() -> None:
    servicer = StandIn([answers])
    async with client_of(servicer) as client:
        results = await asyncio.gather(*(run(client) for _ in range(5)))
        assert all(len(r) == 2 and r[-1].HasField("final") for r in results)
        assert sorted(r[0].delta.token_ids[0] for r in results) == [1, 2, 3, 4, 5]  # each got its own tag's
        assert servicer.opened == 1
        assert servicer.generate_calls == 0


@pytest.mark.slow
async def test_unavailable_before_any_response_is_retried_then_reported() -> None:
    servicer = StandIn([unavailable_tags])
    async with client_of(servicer) as client:
        with pytest.raises(UnavailableError):
            await run(client)
        assert len(servicer.received) == 5  # 5 attempts, as the channel's retry policy for plain calls


async def test_a_broken_stream_fails_its_open_generations_and_the_next_one_reopens() -> None:
    servicer = StandIn([breaks_after_a_delta, answers])
    async with client_of(servicer) as client:
        seen: list[inference_pb2.GenerateResponse] = []

        async def consume() -> None:
            async for response in client.generate(REQUEST):
                seen.append(response)

        with pytest.raises(UnavailableError):
            await consume()
        assert len(seen) == 1  # a delta had arrived: not retried (the harness saw part of the turn)
        assert len(await run(client)) == 2  # a new stream
        assert servicer.opened == 2


async def test_a_stream_that_ends_before_delivering_anything_is_retried_whatever_its_code() -> None:
    # An old server's UNIMPLEMENTED once came back to the client as another code (a CI run): the stream's
    # end, not the generation's answer.
    servicer = StandIn([ends_at_once, answers])
    async with client_of(servicer) as client:
        assert [r.WhichOneof("event") for r in await run(client)] == ["delta", "final"]
        assert servicer.opened == 2


async def test_a_stream_that_breaks_with_internal_after_answering_is_retried_on_a_new_one() -> None:
    servicer = StandIn([answers_once_then_breaks, answers])
    async with client_of(servicer) as client:
        assert len(await run(client)) == 2
        assert [r.WhichOneof("event") for r in await run(client)] == ["delta", "final"]  # on the second stream
        assert servicer.opened == 2


@pytest.mark.slow
async def test_a_generation_whose_streams_all_break_is_unavailable_not_internal() -> None:
    # UNAVAILABLE is what a ReplicaSet fails over on: the call never reached a live server.
    servicer = StandIn([answers_once_then_breaks, ends_at_once])
    async with client_of(servicer) as client:
        assert len(await run(client)) == 2
        with pytest.raises(UnavailableError):
            await run(client)


async def test_a_consumer_that_leaves_cancels_its_tag() -> None:
    servicer = StandIn([silent])
    async with client_of(servicer) as client:
        stream = client.generate(REQUEST)
        await anext(stream)
        await stream.aclose()  # the harness went away
        await eventually(
            lambda: any(r.WhichOneof("action") == "cancel" for r in servicer.received), 2, what="the cancel action"
        )
        actions = [(r.tag, r.WhichOneof("action")) for r in servicer.received]
        assert actions == [(1, "generate"), (1, "cancel")]


async def test_internal_errors_stay_generic() -> None:
    async with client_of(StandIn([internal])) as client:
        with pytest.raises(InternalError) as caught:
            await run(client)
        assert "/srv" not in caught.value.message


class OldServer(StandIn):
    """A server built before GenerateMany existed."""

    async def GenerateMany(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        yield inference_pb2.GenerateManyResponse()  # pragma: no cover (makes this an async generator)


async def test_a_server_without_generate_many_gets_generate_calls() -> None:
    servicer = OldServer([answers])
    async with client_of(servicer) as client:
        assert [r.WhichOneof("event") for r in await run(client)] == ["delta", "final"]
        assert [r.WhichOneof("event") for r in await run(client)] == ["delta", "final"]
        assert servicer.generate_calls == 2


# -- the server half (lodestar_inference.multiplex), with a scripted generate -------------------------


async def test_draining_refuses_new_tags_and_ends_after_the_open_ones() -> None:
    release = asyncio.Event()

    async def generate(request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        yield _delta(1)
        await release.wait()
        yield _final()

    mux = Multiplexer(generate)
    mux.start(1, REQUEST)
    batches = mux.batches()
    first = await anext(batches)
    assert [(tag, outcome.WhichOneof("event")) for tag, outcome in first] == [(1, "delta")]  # type: ignore[union-attr]
    mux.drain()
    mux.start(2, REQUEST)
    refused = await anext(batches)
    assert [(tag, type(outcome)) for tag, outcome in refused] == [(2, UnavailableError)]
    release.set()
    rest = [item async for batch in batches for item in batch]
    assert [(tag, outcome.WhichOneof("event")) for tag, outcome in rest] == [(1, "final")]  # type: ignore[union-attr]
    assert mux.open_tags == 0
