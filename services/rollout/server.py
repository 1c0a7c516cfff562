"""RolloutService server.

The behaviour of RolloutService lands with its own issue; until then every RPC answers UNIMPLEMENTED
while health, reflection and the drain on SIGTERM work like in every other service.
"""

from __future__ import annotations

from lodestar.grpc.server import GrpcServer, serve_until_terminated, service_name
from lodestar.grpc.skeleton import unimplemented_servicer
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from services.rollout.settings import RolloutSettings


def build_server(settings: RolloutSettings) -> GrpcServer:
    server = GrpcServer("rollout", host=settings.host, port=settings.port, drain_seconds=settings.drain_seconds)
    descriptor = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
    server.add_service(
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        unimplemented_servicer(rollout_pb2_grpc.RolloutServiceServicer, descriptor),
        service_name(rollout_pb2.DESCRIPTOR, "RolloutService"),
    )
    return server


async def serve(settings: RolloutSettings) -> None:
    await serve_until_terminated(build_server(settings))
