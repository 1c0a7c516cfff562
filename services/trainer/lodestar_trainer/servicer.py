"""TrainerService: a thin gRPC translation over `lodestar_trainer.runner.TrainerRunner`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc.aio
from google.protobuf import timestamp_pb2

from lodestar.v1 import trainer_pb2, trainer_pb2_grpc
from lodestar_trainer.metrics import StepRecord
from lodestar_trainer.runner import TrainerRunner
from lodestar_trainer.status import Phase, Status, StopReason

Context = grpc.aio.ServicerContext[Any, Any]

STATES = {
    Phase.WAITING: trainer_pb2.TRAINER_STATE_WAITING,
    Phase.TRAINING: trainer_pb2.TRAINER_STATE_TRAINING,
    Phase.STOPPED: trainer_pb2.TRAINER_STATE_STOPPED,
    Phase.FAILED: trainer_pb2.TRAINER_STATE_FAILED,
}
STOP_REASONS = {
    StopReason.NONE: trainer_pb2.STOP_REASON_UNSPECIFIED,
    StopReason.STEPS_DONE: trainer_pb2.STOP_REASON_STEPS_DONE,
    StopReason.STOP_REQUESTED: trainer_pb2.STOP_REASON_STOP_REQUESTED,
    StopReason.RUN_ENDED: trainer_pb2.STOP_REASON_RUN_ENDED,
    StopReason.NO_SIGNAL: trainer_pb2.STOP_REASON_NO_SIGNAL,
}


def step_metrics(record: StepRecord) -> trainer_pb2.StepMetrics:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(record.time * 1e9))
    return trainer_pb2.StepMetrics(
        step=record.step, policy_version=record.policy_version, time=stamp, values=record.values
    )


def status_response(status: Status) -> trainer_pb2.GetStatusResponse:
    response = trainer_pb2.GetStatusResponse(
        state=STATES[status.phase],
        step=status.step,
        policy_version=status.policy_version,
        run_id=status.run_id,
        last_checkpoint_path=status.last_checkpoint,
        error=status.error,
        warning=status.warning,
        skipped_steps=status.skipped_steps,
        untrained_groups=status.untrained_groups,
        untrained_reward_mean=status.untrained_reward_mean,
        stop_reason=STOP_REASONS[status.stop_reason if status.phase == Phase.STOPPED else StopReason.NONE],
    )
    if status.last_record is not None:
        response.last_metrics.CopyFrom(step_metrics(status.last_record))
    return response


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, runner: TrainerRunner) -> None:
        self._runner = runner

    async def GetStatus(self, request: trainer_pb2.GetStatusRequest, context: Context) -> trainer_pb2.GetStatusResponse:
        return status_response(self._runner.status())

    async def StreamMetrics(
        self, request: trainer_pb2.StreamMetricsRequest, context: Context
    ) -> AsyncIterator[trainer_pb2.StreamMetricsResponse]:
        async for record in self._runner.records():
            yield trainer_pb2.StreamMetricsResponse(metrics=step_metrics(record))

    async def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context: Context
    ) -> trainer_pb2.SaveCheckpointResponse:
        path, step = await self._runner.save_checkpoint(Path(request.path) if request.path else None)
        return trainer_pb2.SaveCheckpointResponse(path=str(path), step=step)

    async def Stop(self, request: trainer_pb2.StopRequest, context: Context) -> trainer_pb2.StopResponse:
        status = await self._runner.stop(save_checkpoint=request.save_checkpoint)
        path = status.last_checkpoint if request.save_checkpoint else ""
        return trainer_pb2.StopResponse(state=STATES[status.phase], checkpoint_path=path)
