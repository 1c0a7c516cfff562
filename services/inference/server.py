"""InferenceService gRPC server: a thin servicer over `services.inference.service.InferenceService`.

`serve(settings)` binds the port first (health NOT_SERVING, RPCs answer UNAVAILABLE while the engine
loads), starts the engine, then reports SERVING; SIGTERM drains in-flight RPCs and closes the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from lodestar.grpc.server import GrpcServer, service_name
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from services.inference.service import InferenceService
from services.inference.settings import InferenceSettings

Context = grpc.aio.ServicerContext[Any, Any]


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, service: InferenceService) -> None:
        self._service = service

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        async for response in self._service.generate(request):
            yield response

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


def build_server(settings: InferenceSettings, service: InferenceService) -> GrpcServer:
    server = GrpcServer("inference", host=settings.host, port=settings.port, drain_seconds=settings.drain_seconds)
    server.add_service(
        inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        InferenceServicer(service),
        service_name(inference_pb2.DESCRIPTOR, "InferenceService"),
    )
    return server


async def serve(settings: InferenceSettings) -> None:
    service = InferenceService.create(settings)
    server = build_server(settings, service)
    await server.start()
    try:
        await service.start()
        await server.set_serving(True)
        await server.wait_for_termination()
    finally:
        await server.stop()
        await service.close()
