"""InferenceService server (skeleton until the inference issue lands: every RPC answers UNIMPLEMENTED)."""

from __future__ import annotations

from lodestar.grpc.server import GrpcServer, serve_until_terminated, service_name
from lodestar.grpc.skeleton import unimplemented_servicer
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from services.inference.settings import InferenceSettings


def build_server(settings: InferenceSettings) -> GrpcServer:
    server = GrpcServer("inference", host=settings.host, port=settings.port, drain_seconds=settings.drain_seconds)
    descriptor = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"]
    server.add_service(
        inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        unimplemented_servicer(inference_pb2_grpc.InferenceServiceServicer, descriptor),
        service_name(inference_pb2.DESCRIPTOR, "InferenceService"),
    )
    return server


async def serve(settings: InferenceSettings) -> None:
    await serve_until_terminated(build_server(settings))
