"""TrainerService server: the training loop in a thread behind a thin gRPC servicer.

`serve(settings)` builds the trainer (idle when no --run/--model is given), binds the port, reports
SERVING and starts the loop; SIGTERM drains the server, then stops the loop after its current step. Under
`torchrun` only rank 0 serves gRPC; the other ranks run the same loop in their main thread.
"""

from __future__ import annotations

import asyncio

from lodestar.grpc.server import GrpcServer, service_name
from lodestar.logging import get_logger
from lodestar.v1 import trainer_pb2, trainer_pb2_grpc
from lodestar_trainer.runner import TrainerRunner
from lodestar_trainer.servicer import TrainerServicer
from lodestar_trainer.settings import TrainerSettings

_log = get_logger("trainer")


def build_server(settings: TrainerSettings, runner: TrainerRunner | None = None) -> GrpcServer:
    server = GrpcServer.for_settings("trainer", settings)
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        TrainerServicer(runner or TrainerRunner(None)),
        service_name(trainer_pb2.DESCRIPTOR, "TrainerService"),
    )
    return server


async def serve(settings: TrainerSettings) -> None:
    from lodestar_trainer.wiring import create_trainer  # torch and transformers: only when serving

    trainer = None
    if settings.run is not None and (settings.model is not None or settings.resume is not None):
        trainer = await asyncio.to_thread(create_trainer, settings)
    else:
        _log.warning("trainer idle: no --run and --model given")
    if trainer is not None and not trainer.parallel.is_main:
        await asyncio.to_thread(trainer.run)
        trainer.parallel.close()
        return
    runner = TrainerRunner(trainer)
    server = build_server(settings, runner)
    await server.start()
    try:
        await server.set_serving(True)
        runner.start()
        await server.wait_for_termination()
    finally:
        await runner.close()
        await server.stop()
        if trainer is not None:
            trainer.parallel.close()
