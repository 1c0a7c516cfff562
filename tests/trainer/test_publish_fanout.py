"""Weights to several inference replicas (services/trainer/publish.py FanoutPublisher), two real inference
services (transformers backend, tiny model): one push makes both serve the version; a dead replica is
skipped while another takes it; a refusal stops the push."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lodestar.errors import UnavailableError
from lodestar.local import free_port
from services.trainer.model import dedupe_tied, load_model
from services.trainer.publish import FanoutPublisher, WeightPublisher, WeightsRefusedError, publisher_for
from tests.trainer.inference_helpers import InferenceThread, served_version

pytestmark = pytest.mark.slow


def test_one_push_reaches_every_replica_and_a_dead_one_is_skipped(trainer_model_dir: Path, tmp_path: Path) -> None:
    model = load_model(trainer_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    state = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a") as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "b") as b,
    ):
        publisher = publisher_for(f"{a.address},{b.address}", timeout_s=30, attempts=1)
        assert isinstance(publisher, FanoutPublisher)
        try:
            version = publisher.served_version() + 1
            result = publisher.publish(state, version)
            assert (served_version(a.address), served_version(b.address)) == (version, version)
            assert result.policy_version == version
            assert result.payload_bytes > 0

            with pytest.raises(WeightsRefusedError):  # not newer than what both serve
                publisher.publish(state, version)
        finally:
            publisher.close()

        dead = f"127.0.0.1:{free_port()}"
        survivor = FanoutPublisher([a.address, dead], timeout_s=5, attempts=1, backoff_s=0.1)
        try:
            assert survivor.publish(state, version + 1).policy_version == version + 1
            assert served_version(a.address) == version + 1
            assert survivor.served_version() == version + 1, "the dead replica is not asked"
        finally:
            survivor.close()

    nobody = FanoutPublisher([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], timeout_s=3, attempts=1)
    try:
        with pytest.raises(UnavailableError, match="no inference replica took"):
            nobody.publish(state, 1)
    finally:
        nobody.close()
    assert isinstance(publisher_for("127.0.0.1:1"), WeightPublisher)
