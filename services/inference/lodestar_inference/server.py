"""InferenceService gRPC server: a thin servicer over `lodestar_inference.service.InferenceService`.

`GenerateMany` runs many generations over one stream (`lodestar_inference.multiplex`); its tagged errors
carry the status code and trailing metadata that Generate would have ended the call with.

`serve(settings)` binds the port first (health NOT_SERVING, RPCs answer UNAVAILABLE while the engine
loads), starts the engine, then reports SERVING (and registers in etcd with `--etcd`: registration.py);
SIGTERM leaves etcd, drains in-flight RPCs and closes the engine.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from lodestar.errors import InvalidArgumentError
from lodestar.grpc.errors import status_for, trailing_metadata
from lodestar.grpc.server import GrpcServer, service_name
from lodestar.heap import freeze_startup_heap
from lodestar.inference_registry import ReplicaRegistration
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_inference.multiplex import Multiplexer, Outcome
from lodestar_inference.registration import registration
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings

Context = grpc.aio.ServicerContext[Any, Any]


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._streams: set[Multiplexer] = set()
        self._draining = False

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        async for response in self._service.generate(request):
            yield response

    async def GenerateMany(
        self, request_iterator: AsyncIterator[inference_pb2.GenerateManyRequest], context: Context
    ) -> AsyncIterator[inference_pb2.GenerateManyResponse]:
        mux = Multiplexer(self._service.generate)
        if self._draining:
            mux.drain()
        self._streams.add(mux)
        reader = asyncio.create_task(_read_requests(request_iterator, mux))
        try:
            async for batch in mux.batches():
                yield inference_pb2.GenerateManyResponse(responses=[_tagged(tag, outcome) for tag, outcome in batch])
        finally:
            self._streams.discard(mux)
            reader.cancel()
            await mux.aclose()

    def drain(self) -> None:
        """The server is draining: GenerateMany streams refuse new tags and end when their open ones are done."""
        self._draining = True
        for mux in self._streams:
            mux.drain()

    async def CountTokens(
        self, request: inference_pb2.CountTokensRequest, context: Context
    ) -> inference_pb2.CountTokensResponse:
        return await self._service.count_tokens(request)

    async def UpdateWeights(
        self, request_iterator: AsyncIterator[inference_pb2.UpdateWeightsRequest], context: Context
    ) -> inference_pb2.UpdateWeightsResponse:
        return await self._service.update_weights(request_iterator)

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: Context
    ) -> inference_pb2.GetModelInfoResponse:
        return self._service.model_info()


async def _read_requests(requests: AsyncIterator[inference_pb2.GenerateManyRequest], mux: Multiplexer) -> None:
    """Feed the stream's requests to `mux` until the client half-closes (or the stream breaks)."""
    try:
        async for request in requests:
            action = request.WhichOneof("action")
            if action == "generate":
                mux.start(request.tag, request.generate, request.timeout_s)
            elif action == "cancel":
                mux.cancel(request.tag)
            else:
                mux.reject(request.tag, InvalidArgumentError("a GenerateManyRequest needs `generate` or `cancel`"))
    finally:
        mux.end_input()


def _tagged(tag: int, outcome: Outcome) -> inference_pb2.TaggedGenerateResponse:
    if isinstance(outcome, inference_pb2.GenerateResponse):
        return inference_pb2.TaggedGenerateResponse(tag=tag, response=outcome)
    error = inference_pb2.GenerateError(
        code=status_for(outcome).value[0], message=outcome.message, details=dict(trailing_metadata(outcome))
    )
    return inference_pb2.TaggedGenerateResponse(tag=tag, error=error)


def build_server(settings: InferenceSettings, service: InferenceService) -> GrpcServer:
    server = GrpcServer.for_settings("inference", settings)
    servicer = InferenceServicer(service)
    server.add_service(
        inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        servicer,
        service_name(inference_pb2.DESCRIPTOR, "InferenceService"),
    )
    server.on_drain(servicer.drain)
    return server


async def serve(settings: InferenceSettings) -> None:
    service = InferenceService.create(settings)
    server = build_server(settings, service)
    await server.start()
    service.replica_id = settings.replica_id or f"{socket.gethostname()}:{server.port}"
    registered = None
    try:
        await service.start()
        freeze_startup_heap()
        await server.set_serving(True)
        if (registered := registration(settings, service, server.port)) is not None:
            registered.start()  # leaves etcd when the drain begins: gateways move new calls away at once
            server.on_drain(lambda: _leave(registered))
        await server.wait_for_termination()
    finally:
        await server.stop()
        if registered is not None:
            await registered.stop()
        await service.close()


_leaving: set[asyncio.Future[None]] = set()
"""Registrations being revoked (a reference keeps the task alive until it ends)."""


def _leave(registered: ReplicaRegistration) -> None:
    _leaving.add(task := asyncio.ensure_future(registered.stop()))
    task.add_done_callback(_leaving.discard)
