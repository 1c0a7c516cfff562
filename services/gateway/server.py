"""GatewayService server (skeleton until the gateway issue lands: every RPC answers UNIMPLEMENTED)."""

from __future__ import annotations

from lodestar.grpc.server import GrpcServer, serve_until_terminated, service_name
from lodestar.grpc.skeleton import unimplemented_servicer
from lodestar.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.settings import GatewaySettings


def build_server(settings: GatewaySettings) -> GrpcServer:
    server = GrpcServer("gateway", host=settings.host, port=settings.port, drain_seconds=settings.drain_seconds)
    descriptor = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"]
    server.add_service(
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server,
        unimplemented_servicer(gateway_pb2_grpc.GatewayServiceServicer, descriptor),
        service_name(gateway_pb2.DESCRIPTOR, "GatewayService"),
    )
    return server


async def serve(settings: GatewaySettings) -> None:
    await serve_until_terminated(build_server(settings))
