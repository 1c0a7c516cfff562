"""Weights to several inference replicas (lodestar_trainer/weights/publish.py FanoutPublisher), two real inference
services (transformers backend, tiny model): one push makes both serve the version; a dead replica is
skipped while another takes it; a refusal stops the push."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from lodestar.errors import UnavailableError
from lodestar_app.local import free_port
from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.publish import FanoutPublisher, WeightPublisher, WeightsRefusedError, publisher_for
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


def test_a_replica_back_at_its_address_gets_the_next_push_though_its_old_channel_backs_off(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    """The re-run chaos hour: a replica SIGKILLed and restarted at its address missed three pushes after it had
    registered again (its versions reported to rollout all the same): the trainer's channel to the address was
    in gRPC's reconnect backoff, failing every push at once with the dead process's "connection refused". Here
    the replica is down for 12 s of pushes (a channel kept for the address backs off to several seconds between
    connection attempts), then a real replica starts at the address, and the next push must reach it."""
    state = dedupe_tied(load_model(trainer_model_dir), dict(load_model(trainer_model_dir).state_dict()))
    port = free_port()
    late = f"127.0.0.1:{port}"
    with InferenceThread.start(trainer_model_dir, tmp_path / "a") as a:
        publisher = FanoutPublisher([a.address, late], timeout_s=10, attempts=1)
        try:
            version = publisher.served_version()
            down_until = time.monotonic() + 12
            while time.monotonic() < down_until:  # the trainer keeps stepping: each push misses `late`
                version += 1
                publisher.publish(state, version)
                time.sleep(0.3)
            assert served_version(a.address) == version
            with InferenceThread.start(trainer_model_dir, tmp_path / "late", port=port) as back:
                assert back.address == late
                publisher.publish(state, version + 1)
                assert served_version(late) == version + 1, "the replica back at its address missed the push"
        finally:
            publisher.close()


def test_weights_travel_in_the_dtype_inference_serves(trainer_model_dir: Path, tmp_path: Path) -> None:
    """A bf16 replica gets a bf16 payload (half the fp32 bytes), then serves the version; an fp32 one gets fp32."""
    model = load_model(trainer_model_dir)
    state = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "bf16", dtype="bfloat16") as bf16,
        InferenceThread.start(trainer_model_dir, tmp_path / "fp32") as fp32,
    ):
        half, full = WeightPublisher(bf16.address, timeout_s=30), WeightPublisher(fp32.address, timeout_s=30)
        try:
            assert (half.wire_dtype(), full.wire_dtype()) == ("bfloat16", "float32")
            small = half.publish(state, served_version(bf16.address) + 1)
            large = full.publish(state, served_version(fp32.address) + 1)
            assert served_version(bf16.address) == small.policy_version
            assert small.payload_bytes < 0.55 * large.payload_bytes
            mixed = FanoutPublisher([bf16.address, fp32.address], timeout_s=30)
            try:
                assert len(mixed.prepare(state)) == large.payload_bytes, "replicas that differ get the state as is"
            finally:
                mixed.close()
        finally:
            half.close()
            full.close()
