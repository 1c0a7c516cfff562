"""Activation checkpointing (services/trainer/lodestar_trainer/model.py) and where collectives put their tensors
(lodestar_trainer/parallel/distributed.py): checkpointed decoder layers recompute in the backward and give the same
gradients on the tree layout; `Parallel` builds its reduction tensors on its collective device (NCCL refuses
CPU tensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.model import enable_activation_checkpointing, load_model
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.step.forward import target_logprobs
from lodestar_trainer.wiring import create_trainer
from tests.trainer.helpers import trainer_settings


def _gradients(model: Any) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of the summed target logprobs of a prefix-merged group, and layer 0's forward count."""
    calls = 0

    def count(*_: Any) -> None:
        nonlocal calls
        calls += 1

    model.model.layers[0].register_forward_pre_hook(count)  # (a recompute may stop before the layer returns)
    samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=4)
    (batch,) = pack(build_sequences(BuilderKind.PREFIX_MERGING, samples).sequences, token_budget=100_000)
    target_logprobs(model, batch, vocab_chunk=1000, attention_block=32).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, calls


def test_checkpointed_layers_recompute_and_give_the_same_gradients(trainer_model_dir: Path) -> None:
    plain, plain_calls = _gradients(load_model(trainer_model_dir))
    model = load_model(trainer_model_dir)
    enable_activation_checkpointing(model)
    checkpointed, calls = _gradients(model)
    assert (plain_calls, calls) == (1, 2), "a checkpointed layer runs again in the backward"
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_setting_turns_it_on_and_cpu_leaves_it_off(trainer_model_dir: Path, tmp_path: Path) -> None:
    def trainer(**fields: Any) -> Any:
        settings = trainer_settings(run="r", model=trainer_model_dir, run_dir=tmp_path, inference="", **fields)
        return create_trainer(settings, connect=False).model

    assert trainer().is_gradient_checkpointing is False
    assert trainer(activation_checkpointing=True).is_gradient_checkpointing is True


def test_collectives_build_their_tensors_on_the_collective_device() -> None:
    assert Parallel().collective_tensor([1.0, 2.0]).device.type == "cpu"
    tensor = Parallel(rank=0, world=2, device="meta").collective_tensor([1.0, 2.0])
    assert (tensor.device.type, tensor.dtype, tuple(tensor.shape)) == ("meta", torch.float64, (2,))
