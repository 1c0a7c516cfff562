"""Weight push to the real inference service (transformers backend, tiny model, in-process gRPC server)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lodestar.errors import UnavailableError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_app.local import free_port
from lodestar_inference.weights import default_spool_dir, in_memory
from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.publish import WeightPublisher, WeightsRefusedError
from tests.trainer.inference_helpers import InferenceThread, generate, served_version, text_message, trainer_logprobs


@pytest.fixture(scope="module")
def inference(trainer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceThread]:
    with InferenceThread.start(trainer_model_dir, tmp_path_factory.mktemp("spool")) as server:
        yield server


def greedy(address: str) -> inference_pb2.GenerateFinal:
    request = inference_pb2.GenerateRequest(
        messages=[text_message(common_pb2.ROLE_USER, "Say something.")],
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=4),
    )
    return generate(address, request)


def test_pushed_weights_are_served_under_the_new_version(inference: InferenceThread, trainer_model_dir: Path) -> None:
    model = load_model(trainer_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    before = greedy(inference.address)
    version = served_version(inference.address) + 1
    publisher = WeightPublisher(inference.address, timeout_s=30)
    try:
        result = publisher.publish(dedupe_tied(model, dict(model.state_dict())), version)
    finally:
        publisher.close()
    assert result.policy_version == version
    assert result.attempts == 1
    assert result.tensors == len(model.state_dict())
    assert result.payload_bytes > 0
    assert served_version(inference.address) == version
    after = greedy(inference.address)
    assert before.policy_version == version - 1
    assert after.policy_version == version
    assert list(after.completion_logprobs) != list(before.completion_logprobs)


def test_a_stream_spooled_in_memory_is_served_exactly(trainer_model_dir: Path) -> None:
    """The default spool is /dev/shm, and a replica maps a version spooled there instead of copying it: what
    it serves after the push (and after the spool file is deleted) is exactly the trainer's weights."""
    model = load_model(trainer_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    spool = Path(tempfile.mkdtemp(dir=default_spool_dir(), prefix="lodestar-test-spool-"))
    try:
        assert in_memory(spool), "this machine's /dev/shm is a tmpfs"
        with InferenceThread.start(trainer_model_dir, spool) as server:
            publisher = WeightPublisher(server.address, timeout_s=30)
            try:
                publisher.publish(dedupe_tied(model, dict(model.state_dict())), served_version(server.address) + 1)
            finally:
                publisher.close()
            assert not list(spool.iterdir()), "the spool file is deleted after the swap"
            final = greedy(server.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model.eval(), final), abs=1e-4)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def test_refused_weights_are_a_clear_error_and_inference_keeps_serving(
    inference: InferenceThread, trainer_model_dir: Path
) -> None:
    served = served_version(inference.address)
    publisher = WeightPublisher(inference.address, timeout_s=30)
    try:
        with pytest.raises(WeightsRefusedError, match=r"refused the weights of policy version .*shape \[3, 3\]"):
            publisher.publish({"lm_head.weight": torch.zeros(3, 3)}, served + 1)
        model = load_model(trainer_model_dir)
        with pytest.raises(WeightsRefusedError, match="not newer than the served version"):
            publisher.publish({"lm_head.weight": model.lm_head.weight.detach()}, served)
    finally:
        publisher.close()
    assert served_version(inference.address) == served
    assert greedy(inference.address).policy_version == served


def test_unreachable_inference_fails_after_the_retries() -> None:
    publisher = WeightPublisher(f"127.0.0.1:{free_port()}", timeout_s=0.5, attempts=2, backoff_s=0.05)
    try:
        with pytest.raises(UnavailableError, match="after 2 attempts"):
            publisher.publish({"w": torch.zeros(2)}, 1)
    finally:
        publisher.close()
