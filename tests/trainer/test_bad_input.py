"""Bad input never becomes a silent zero loss: a bad group skips its step with the reason in the log, the
status and skipped_steps (and writes no metrics line); weights that inference refuses FAIL the trainer with
inference's reason, visible through TrainerService.GetStatus."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc.aio
import pytest

from lodestar.v1 import rollout_pb2, trainer_pb2, trainer_pb2_grpc
from lodestar_trainer.model import load_model
from lodestar_trainer.runner import TrainerRunner
from lodestar_trainer.server import build_server
from lodestar_trainer.status import Phase
from lodestar_trainer.weights.publish import WeightPublisher
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, FeedSource, make_group
from tests.trainer.helpers import trainer_for, trainer_settings
from tests.trainer.inference_helpers import InferenceThread, served_version
from tests.waiting import eventually


def _other_run(group: rollout_pb2.Group) -> None:
    group.run_id = "run-other"


def _empty(group: rollout_pb2.Group) -> None:
    group.ClearField("sessions")


def _short_logprobs(group: rollout_pb2.Group) -> None:
    group.sessions[2].calls[1].completion_logprobs.pop()


def _foreign_tokens(group: rollout_pb2.Group) -> None:
    group.sessions[1].calls[0].completion_token_ids[0] = 1_000_000


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (_other_run, "group bad belongs to run 'run-other', not to the trained run 'run-test'"),
        (_empty, "group bad has no scored session (0 sessions in all)"),
        (_short_logprobs, "group bad, session bad-s2: call bad-s2#1 has"),
        (_foreign_tokens, "group bad has token id 1000000, outside the model's vocabulary of"),
    ],
)
@pytest.mark.slow
def test_a_bad_group_skips_its_step_and_says_why(
    trainer_model_dir: Path, tmp_path: Path, spoil: Callable[[rollout_pb2.Group], None], reason: str
) -> None:
    bad = make_group(7, group_id="bad")
    spoil(bad)
    trainer, source = trainer_for(trainer_model_dir, tmp_path, [make_group(0), bad, make_group(1)], steps=2)
    trainer.run()
    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED
    assert (status.step, status.skipped_steps) == (2, 1)
    assert status.error.startswith(reason)
    assert trainer.state.groups_read == 3
    assert trainer.state.skipped_steps == 1
    assert source.reported == [1, 2]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert all(json.loads(line)["loss"] != 0.0 for line in lines)


@pytest.fixture
def inference(trainer_model_dir: Path, tmp_path: Path) -> Iterator[InferenceThread]:
    with InferenceThread.start(trainer_model_dir, tmp_path / "spool") as server:
        yield server


@pytest.mark.slow
async def test_weights_refused_by_inference_fail_the_trainer_with_the_reason(
    inference: InferenceThread, trainer_model_dir: Path, tmp_path: Path
) -> None:
    # Another writer already published version 5: the trainer's version 1 is not newer and is refused.
    publisher = WeightPublisher(inference.address, timeout_s=30)
    model = load_model(trainer_model_dir)
    publisher.publish({"lm_head.weight": model.lm_head.weight.detach().clone()}, 5)
    publisher.close()
    settings = trainer_settings(run=RUN, model=trainer_model_dir, inference=inference.address, run_dir=tmp_path / "run")
    trainer = create_trainer(settings, connect=False)
    trainer.publisher = WeightPublisher(inference.address, timeout_s=30)
    trainer.source = FeedSource([make_group(0), make_group(1)])
    runner = TrainerRunner(trainer)
    server = build_server(settings.model_copy(update={"port": 0}), runner)
    port = await server.start()
    await server.set_serving(True)
    runner.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            status = await eventually(  # up to 60 s on a loaded machine
                lambda: stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=10),
                60,
                what="the trainer FAILED",
                until=lambda status: status.state == trainer_pb2.TRAINER_STATE_FAILED,
            )
            assert "refused the weights of policy version 1" in status.error
            assert "not newer than the served version 5" in status.error
    finally:
        await runner.close()
        await server.stop(0)
    assert served_version(inference.address) == 5
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().strip()  # the failed step wrote no metrics
