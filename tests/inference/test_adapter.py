"""Adapter-only push to the transformers engine (lodestar_inference/adapter.py): after a LoRA trainer pushes
its adapter, the engine's logprobs of the tokens it samples equal the trainer's to 1e-4; an adapter is merged
onto the base (a replica that missed a version serves the next one exactly); bad adapters are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference.adapter import check_adapter, merge_adapter
from lodestar_inference.engine import EngineRequest, SamplingOptions, TensorMeta, WeightUpdate
from lodestar_inference.engines.transformers import TransformersEngine
from lodestar_inference.weights import read_safetensors_meta
from lodestar_trainer.lora import apply_lora, lora_layers, push_state
from lodestar_trainer.model import load_model
from lodestar_trainer.settings import LoraSettings
from lodestar_trainer.weights.publish import WeightPublisher, WeightsRefusedError
from tests.inference.lora_helpers import adapted
from tests.trainer.inference_helpers import InferenceThread, generate, served_version, text_message, trainer_logprobs


@pytest.fixture(scope="module")
def inference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceThread]:
    with InferenceThread.start(tiny_model_dir, tmp_path_factory.mktemp("spool")) as server:
        yield server


def push(address: str, model: Any, version: int) -> int:
    publisher = WeightPublisher(address, timeout_s=30)
    try:
        result = publisher.publish(push_state(model), version)
    finally:
        publisher.close()
    return int(result.payload_bytes)


def sampled(address: str, seed: int) -> inference_pb2.GenerateFinal:
    request = inference_pb2.GenerateRequest(
        messages=[text_message(common_pb2.ROLE_USER, "Write some code.")],
        sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=12, seed=seed),
    )
    return generate(address, request)


def test_engine_logprobs_equal_the_trainers_after_an_adapter_push(
    inference: InferenceThread, tiny_model_dir: Path
) -> None:
    base = load_model(tiny_model_dir).eval()
    version = served_version(inference.address)
    for step, seed in enumerate((11, 12), start=1):  # the second adapter replaces the first (merged on the base)
        model = adapted(tiny_model_dir, seed)
        payload = push(inference.address, model, version + step)
        assert payload < sum(tensor.numel() * 4 for tensor in base.state_dict().values()) / 4
        final = sampled(inference.address, seed)
        assert final.policy_version == version + step
        served = list(final.completion_logprobs)
        expected = trainer_logprobs(model, final)
        assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-4
        plain = trainer_logprobs(base, final)
        assert max(abs(a - b) for a, b in zip(served, plain, strict=True)) > 1e-3  # the adapter is in use


async def test_a_request_in_flight_finishes_on_the_adapter_it_started_with(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A request started on adapter 1 keeps adapter 1 for every token while adapter 2 lands (engine level),
    and its logprobs are adapter 1's; a request started after the swap samples on adapter 2."""
    first, second = adapted(tiny_model_dir, 21), adapted(tiny_model_dir, 22)
    engine = TransformersEngine(tiny_model_dir, device="cpu", dtype="float32", max_batch_size=2)
    await engine.start()
    try:
        await engine.update_weights(adapter_update(first, 1, tmp_path / "v1.safetensors"))
        prompt = (5, 6, 7, 8)
        running = engine.generate(EngineRequest("r1", prompt, SamplingOptions(max_tokens=24, seed=3)))
        steps = [await anext(running)]
        await engine.update_weights(adapter_update(second, 2, tmp_path / "v2.safetensors"))
        steps += [step async for step in running]
        assert {step.policy_version for step in steps} == {1}
        assert all(not step.version_spans or {span.version for span in step.version_spans} == {1} for step in steps)
        ids = [token for step in steps for token in step.token_ids]
        served = [logprob for step in steps for logprob in step.logprobs]
        assert max(abs(a - b) for a, b in zip(served, forced(first, prompt, ids), strict=True)) < 1e-4
        later = [step async for step in engine.generate(EngineRequest("r2", prompt, SamplingOptions(max_tokens=6)))]
        assert {step.policy_version for step in later} == {2}
        ids = [token for step in later for token in step.token_ids]
        served = [logprob for step in later for logprob in step.logprobs]
        assert max(abs(a - b) for a, b in zip(served, forced(second, prompt, ids), strict=True)) < 1e-4
    finally:
        await engine.close()


def adapter_update(model: Any, version: int, path: Path) -> WeightUpdate:
    save_file(push_state(model), str(path))
    return WeightUpdate(path, tuple(read_safetensors_meta(path)), version, (path,))


def forced(model: Any, prompt: tuple[int, ...], ids: list[int]) -> list[float]:
    """`model`'s logprob of each of `ids` after `prompt` (teacher forcing, fp32)."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([[*prompt, *ids]])).logits[0].float(), dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(ids)]


def test_a_bad_adapter_is_refused(inference: InferenceThread, tiny_model_dir: Path) -> None:
    model = adapted(tiny_model_dir, 31)
    state = push_state(model)
    name = next(iter(state))
    publisher = WeightPublisher(inference.address, timeout_s=30, attempts=1)
    try:
        with pytest.raises(WeightsRefusedError, match="without its lora_B"):
            publisher.publish({name: state[name]}, served_version(inference.address) + 1)
    finally:
        publisher.close()


def test_check_adapter_names_what_does_not_fit() -> None:
    expected = {"m.q.weight": TensorMeta("m.q.weight", (8, 4), "F32")}
    good = [TensorMeta("m.q.lora_A.weight", (2, 4), "F32"), TensorMeta("m.q.lora_B.weight", (8, 2), "F32")]
    check_adapter(expected, good)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        check_adapter(expected, [good[0], TensorMeta("m.q.lora_B.weight", (8, 3), "F32")])
    with pytest.raises(InvalidArgumentError, match="adapts no linear weight"):
        check_adapter({}, good)
    with pytest.raises(InvalidArgumentError, match="mixes adapter tensors"):
        check_adapter(expected, [*good, TensorMeta("m.q.weight", (8, 4), "F32")])
    adapter = {"m.q.lora_A.weight": torch.ones(2, 4), "m.q.lora_B.weight": torch.ones(8, 2)}
    merged = merge_adapter({"m.q.weight": torch.zeros(8, 4)}, adapter)
    assert torch.equal(merged["m.q.weight"], torch.full((8, 4), 2.0))


def test_vllm_engine_reloads_the_merged_adapter_with_whole_fused_groups(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The vllm engine's reload file for an adapter of q and v only (no vLLM needed: the file it would hand
    to vLLM's reload): q and v are base + B @ A, and k, the rest of their fused qkv group, is the base's."""
    from safetensors.torch import load_file

    from lodestar_inference.engines.vllm import VllmEngine
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.weights import read_checkpoint_meta

    engine = VllmEngine(InferenceSettings(backend="vllm", model=tiny_model_dir))
    files, metas = read_checkpoint_meta(tiny_model_dir)
    engine._sources = {meta.name: files[0] for meta in metas}
    engine._base_sources = dict(engine._sources)
    engine._expected = {meta.name: meta for meta in metas}
    engine._packed_of = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
    model = apply_lora(
        load_model(tiny_model_dir), LoraSettings(enabled=True, rank=4, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for module in lora_layers(model).values():
            module.lora_B["default"].weight.normal_(0.0, 0.05)
    update = adapter_update(model, 1, tmp_path / "adapter.safetensors")
    engine.validate_weights(update.tensors)
    names = engine._write_reload_file(update, tmp_path / "reload.safetensors")
    written, base = load_file(str(tmp_path / "reload.safetensors")), load_file(str(files[0]))
    layer = "model.layers.0.self_attn"
    assert {f"{layer}.{part}_proj.weight" for part in "qkv"} <= set(names)
    assert torch.equal(written[f"{layer}.k_proj.weight"], base[f"{layer}.k_proj.weight"])
    pushed = push_state(model)
    want = (
        base[f"{layer}.q_proj.weight"]
        + pushed[f"{layer}.q_proj.lora_B.weight"] @ pushed[f"{layer}.q_proj.lora_A.weight"]
    )
    assert torch.allclose(written[f"{layer}.q_proj.weight"], want, atol=1e-6)
    assert not torch.equal(written[f"{layer}.q_proj.weight"], base[f"{layer}.q_proj.weight"])
