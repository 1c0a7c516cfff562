"""TrainerService server.

The behaviour of TrainerService lands with its own issue; until then every RPC answers UNIMPLEMENTED
while health, reflection and the drain on SIGTERM work like in every other service.
"""

from __future__ import annotations

from lodestar.grpc.server import GrpcServer, serve_until_terminated, service_name
from lodestar.grpc.skeleton import unimplemented_servicer
from lodestar.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.settings import TrainerSettings


def build_server(settings: TrainerSettings) -> GrpcServer:
    server = GrpcServer("trainer", host=settings.host, port=settings.port, drain_seconds=settings.drain_seconds)
    descriptor = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"]
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        unimplemented_servicer(trainer_pb2_grpc.TrainerServiceServicer, descriptor),
        service_name(trainer_pb2.DESCRIPTOR, "TrainerService"),
    )
    return server


async def serve(settings: TrainerSettings) -> None:
    await serve_until_terminated(build_server(settings))
