"""A trainer restarted behind what inference serves keeps training (a defect the chaos run found, docs/chaos.md).

The trainer pushed versions after its last checkpoint and died (or died mid-push, leaving the replicas on two
versions, or had no checkpoint yet): its resumed or fresh state's version is older than what the replicas
serve, and they refuse any push that is not newer. Before the fix its first push was refused and the trainer
FAILED ("policy version 1 is not newer than the served version 3"); now it pushes its weights as the newest
served version + 1 and goes on from there. Two real inference replicas (in-process gRPC, the tiny model).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.status import Phase
from lodestar_trainer.weights.publish import FanoutPublisher, WeightPublisher
from tests.trainer.groups_helpers import make_group
from tests.trainer.helpers import trainer_for
from tests.trainer.inference_helpers import InferenceThread, served_version


def _push(address: str, weights: dict[str, torch.Tensor], version: int) -> None:
    publisher = WeightPublisher(address, timeout_s=30)
    try:
        publisher.publish(weights, version)
    finally:
        publisher.close()


def test_a_trainer_behind_the_served_versions_goes_on_after_them(trainer_model_dir: Path, tmp_path: Path) -> None:
    model = load_model(trainer_model_dir)
    weights = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-a") as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-b") as b,
    ):
        _push(a.address, weights, 3)  # the dead trainer's push of v3 reached one replica only
        _push(b.address, weights, 2)
        trainer, _ = trainer_for(trainer_model_dir, tmp_path, [make_group(0)], steps=1)
        trainer.publisher = FanoutPublisher([a.address, b.address], timeout_s=30)
        try:
            trainer.run()
        finally:
            trainer.publisher.close()
        status = trainer.board.snapshot()
        assert (status.phase, status.step, status.policy_version) == (Phase.STOPPED, 1, 5), status.error
        assert served_version(a.address) == served_version(b.address) == 5
