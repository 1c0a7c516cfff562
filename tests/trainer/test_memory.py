"""The step-memory estimator (step/memory.py) against what torch really allocates on the tiny model, the docs
table it generates, and the AdamW implementations it assumes (step/adamw.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_trainer.step import adamw
from lodestar_trainer.step.memory import GIB, H100_GIB, SHAPES, ModelShape, OptimizerImpl, step_memory, table
from lodestar_trainer.step.precision import ComputeCopy

ROOT = Path(__file__).resolve().parents[2]


def _unique_bytes(tensors: Any) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("tied", [False, True])
def test_the_shape_counts_the_models_parameters(tiny_lm: Any, tied_model_dir: Path, tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tied_model_dir) if tied else tiny_lm
    shape = ModelShape.of(model.config)
    assert shape.tied is tied
    assert shape.params() == sum(p.numel() for p in model.parameters())  # parameters() counts a tied one once


def test_weights_gradients_and_moments_are_what_a_bf16_step_allocates(tiny_lm: Any) -> None:
    """One real step of the one-process bf16 path: the fp32 master, its bf16 copy, the copy's gradients, the
    fp32 gradients and AdamW's two moments, each the estimator's bytes exactly."""
    predicted = step_memory(ModelShape.of(tiny_lm.config), tokens=64, optimizer="for_loop").components
    copy = ComputeCopy(tiny_lm, torch.bfloat16)
    optimizer = adamw.adamw(tiny_lm.parameters(), lr=1e-3, weight_decay=0.0, impl="for_loop")
    ids = torch.randint(0, tiny_lm.config.vocab_size, (1, 64))
    copy.model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    assert _unique_bytes(tiny_lm.parameters()) == predicted["master weights (fp32)"]
    assert _unique_bytes(copy.model.parameters()) == predicted["compute copy"]
    assert _unique_bytes(p.grad for p in copy.model.parameters()) == predicted["compute-copy gradients"]
    copy.grads_to_master()
    assert _unique_bytes(p.grad for p in tiny_lm.parameters()) == predicted["gradients (fp32)"]
    optimizer.step()
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert _unique_bytes(moments) == predicted["AdamW moments"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layers_activations_are_what_autograd_saves(tiny_lm: Any, dtype: torch.dtype) -> None:
    """The bytes per token autograd keeps for one decoder layer (every saved tensor's storage once, weights
    left out) within 5% of `layer_saved_bytes`: the per-layer term of the activations with and without
    checkpointing. (transformers' SDPA path on CPU; flex on CUDA saves q, k, v, its output and the logsumexp,
    no more.)"""
    model = tiny_lm.to(dtype)
    tokens = 256
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    hidden = torch.randn(1, tokens, model.config.hidden_size, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens)[None]
    rotary = model.model.rotary_emb(hidden, positions)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.model.layers[0](hidden, attention_mask=None, position_embeddings=rotary, position_ids=positions)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(size for pointer, size in saved.items() if pointer not in weights) / tokens
    predicted = ModelShape.of(model.config).layer_saved_bytes(dtype.itemsize)
    assert measured == pytest.approx(predicted, rel=0.05)


def test_a_4b_step_fits_one_80gb_gpu_with_fused_adamw_and_not_with_foreach() -> None:
    """Finding 3 of issue 43, by construction: fp32 master + bf16 copy + fp32 gradients + moments of Qwen3-4B,
    at 16K-token micro-batches with checkpointing, fit 80 GB with the fused step; the multi-tensor step's
    full-size temporary (torch's CUDA default) does not."""
    shape = SHAPES["Qwen3-4B"]
    assert shape.params() == pytest.approx(4.02e9, rel=0.005)
    fused = step_memory(shape, tokens=16384)
    assert fused.fits(H100_GIB)
    assert fused.peak > 60 * GIB
    assert not step_memory(shape, tokens=16384, optimizer="foreach").fits(H100_GIB)
    assert adamw.implementation("cuda") == "fused"
    assert adamw.implementation("cuda:1") == "fused"
    assert not step_memory(SHAPES["Qwen3-8B"], tokens=16384).fits(H100_GIB)
    assert step_memory(SHAPES["Qwen3-8B"], tokens=16384, shards=8).fits(H100_GIB)


def test_docs_gpu_md_shows_the_table_the_estimator_computes() -> None:
    doc = (ROOT / "docs" / "gpu.md").read_text()
    assert table() in doc, "regenerate: python -m lodestar_trainer.step.memory"


def _steps(impl: OptimizerImpl, state: dict[str, Any] | None, steps: int, first: int = 0) -> tuple[torch.Tensor, Any]:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 8))
    optimizer = adamw.adamw([weight], lr=1e-2, weight_decay=0.1, impl=impl)
    if state is not None:
        weight.data.copy_(state["weight"])
        optimizer.load_state_dict(state["optimizer"])
        adamw.conform(optimizer, impl)
    for step in range(steps):
        torch.manual_seed(100 + first + step)
        weight.grad = torch.randn(64, 8)
        optimizer.step()
    return weight.detach().clone(), optimizer


def test_fused_adamw_steps_as_the_per_tensor_loop_and_resumes_from_its_state() -> None:
    """The fused kernel (CUDA's choice; torch has it on CPU too) takes the per-tensor loop's steps, and a state
    saved by one implementation resumes in the other with `conform` (the groups' flags and step counters)."""
    fused, _ = _steps("fused", None, 3)
    loop, loop_optimizer = _steps("for_loop", None, 3)
    torch.testing.assert_close(fused, loop, rtol=1e-5, atol=1e-6)
    saved = {"weight": loop, "optimizer": loop_optimizer.state_dict()}
    resumed, optimizer = _steps("fused", saved, 2, first=3)
    assert optimizer.param_groups[0]["fused"] is True
    assert optimizer.param_groups[0]["foreach"] is False
    straight, _ = _steps("for_loop", None, 5)
    torch.testing.assert_close(resumed, straight, rtol=1e-5, atol=1e-6)
