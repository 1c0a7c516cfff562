"""Attention backends against a dense masked reference: the explicit path in bf16 keeps fp32 softmax statistics
(outputs and gradients within bf16 rounding of the fp64 result), flex attention's BlockMask tiles are exactly
the dense mask's, its forward equals the reference on CPU (torch has no flex backward on CPU: the gradient
comparisons run on CUDA, here when a GPU is present and in bench/gpu_check.py), and the setting resolves by
device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.step.attention import TreeLayout, tree_attention
from lodestar_trainer.step.flex import TILE, FlexLayout, padded_length, tile_kinds
from lodestar_trainer.step.forward import target_logprobs
from lodestar_trainer.wiring import check
from tests.trainer.attention_support import dense_mask, random_forest
from tests.trainer.helpers import trainer_settings

CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: FlexAttention has no backward on CPU (torch 2.13)"
)


def _inputs(size: int, dtype: torch.dtype, magnitude: float, device: str = "cpu") -> list[torch.Tensor]:
    """q [1, 4, T, 64], k, v [1, 2, T, 64] (GQA), rounded to `dtype`; large `magnitude` gives peaky softmaxes."""
    torch.manual_seed(0)
    shapes = ((1, 4, size, 64), (1, 2, size, 64), (1, 2, size, 64))
    scales = (magnitude, magnitude, 1.0)
    return [
        (scale * torch.randn(shape)).to(device=device, dtype=dtype) for shape, scale in zip(shapes, scales, strict=True)
    ]


def _reference(
    inputs: list[torch.Tensor], grad_out: torch.Tensor, parents: list[int], scale: float | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Dense masked SDPA in fp64 on the same (already rounded) inputs: output and input gradients."""
    leaves = [tensor.double().requires_grad_() for tensor in inputs]
    mask = dense_mask(parents).to(inputs[0].device)
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale, enable_gqa=True)
    return out, torch.autograd.grad(out, leaves, grad_out.double())


def _within_bf16_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """Each element within half a bf16 ulp (relative 2^-8) of the exact value: only the final cast rounded (plus
    fp32 noise, ~1e-6 of the largest value, where a gradient element cancels to ~0)."""
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-5 * float(want.detach().abs().max()))


def test_explicit_path_in_bf16_keeps_fp32_softmax_statistics() -> None:
    """Scores of magnitude ~30: bf16 scores would round them by up to 0.06 (6% on a probability)."""
    parents = random_forest(300, seed=3)
    inputs = _inputs(300, torch.bfloat16, magnitude=3.0)
    grad_out = torch.randn(1, 4, 300, 64).bfloat16()
    leaves = [tensor.clone().requires_grad_() for tensor in inputs]
    out = tree_attention(*leaves, TreeLayout.of(parents, block=64), None)
    assert out.grad_fn is not None
    assert out.grad_fn.saved_tensors[-1].dtype == torch.float32, "the logsumexp kept for backward is fp32"
    grads = torch.autograd.grad(out, leaves, grad_out)
    want, want_grads = _reference(inputs, grad_out, parents, None)
    assert out.dtype == torch.bfloat16
    _within_bf16_rounding(out, want)
    for got, expected in zip(grads, want_grads, strict=True):
        assert got.dtype == torch.bfloat16
        _within_bf16_rounding(got, expected)


def test_padded_lengths_come_in_two_buckets_per_octave() -> None:
    assert [padded_length(n, 128) for n in (1, 128, 129, 256, 257, 384, 385, 700, 1025, 1537)] == [
        128, 128, 256, 256, 384, 384, 512, 768, 1536, 2048,
    ]  # fmt: skip
    assert all(padded_length(n) % TILE == 0 and padded_length(n) >= n for n in range(1, 5000, 7))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_mask_tiles_are_exactly_the_dense_masks(seed: int) -> None:
    """full tiles: every pair visible; partial: some but not all; skipped: none (tile 8, padded keys invisible)."""
    parents = random_forest(150, seed=seed) if seed else [-1, *range(63), -1, *range(64, 149)]  # 0: 2 documents
    tile, padded = 8, padded_length(150, 8)
    end = torch.zeros(padded, dtype=torch.int32)
    end[:150] = torch.tensor(TreeLayout.of(parents).end.tolist(), dtype=torch.int32)
    partial, full = tile_kinds(end, tile)
    visible = torch.zeros(padded, padded, dtype=torch.bool)
    visible[:150, :150] = dense_mask(parents)
    per_tile = visible.view(padded // tile, tile, padded // tile, tile).transpose(1, 2).flatten(2)
    assert torch.equal(full, per_tile.all(-1))
    assert torch.equal(partial, per_tile.any(-1) & ~per_tile.all(-1))
    assert bool(partial.any())
    assert bool((~partial & ~full).any())
    assert bool(full.any()) or seed > 0  # packed documents have full tiles below the diagonal


@pytest.mark.slow
def test_flex_forward_on_cpu_equals_the_dense_reference() -> None:
    """Compiled flex forward (no grad: CPU has no flex backward) on a tree and on packed documents of one bucket."""
    for parents in (random_forest(300, seed=5), [-1, *range(99), -1, *range(100, 269), -1, *range(270, 299)]):
        inputs = _inputs(300, torch.float32, magnitude=1.0)
        with torch.no_grad():
            out = FlexLayout.of(parents, device="cpu").attend(*inputs, 0.2)
        want, _ = _reference(inputs, torch.zeros(1, 4, 300, 64), parents, 0.2)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def _packed_batch(kind: BuilderKind) -> Any:
    samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=2)
    (batch,) = pack(build_sequences(kind, samples).sequences, token_budget=100_000)
    return batch


@pytest.mark.slow
def test_flex_target_logprobs_equal_the_explicit_ones_on_cpu(tiny_lm: Any) -> None:
    """The flex layout through transformers (forward only on CPU): same logprobs as the explicit path."""
    batch = _packed_batch(BuilderKind.TREE)
    with torch.no_grad():
        explicit = target_logprobs(tiny_lm, batch, vocab_chunk=1000)
        flex = target_logprobs(tiny_lm, batch, vocab_chunk=1000, attention="flex")
    torch.testing.assert_close(flex, explicit, rtol=0, atol=1e-5)


def test_attention_setting_resolves_by_device(trainer_model_dir: Path) -> None:
    def backend(**fields: Any) -> str:
        settings = trainer_settings(run="r", model=trainer_model_dir, **fields)
        check(settings)
        return settings.compute.attention_backend()

    assert backend() == "explicit"
    assert backend(attention="explicit", device="cuda") == "explicit"
    assert backend(device="cuda:1") == "flex"
    with pytest.raises(InvalidArgumentError, match="flex attention has no backward on CPU"):
        backend(attention="flex")


@CUDA
@pytest.mark.parametrize(("dtype", "magnitude"), [(torch.float32, 1.0), (torch.bfloat16, 3.0)])
def test_flex_on_cuda_equals_the_dense_reference_with_gradients(dtype: torch.dtype, magnitude: float) -> None:
    parents = random_forest(700, seed=7)
    inputs = _inputs(700, dtype, magnitude, device="cuda")
    grad_out = torch.randn(1, 4, 700, 64, device="cuda").to(dtype)
    leaves = [tensor.clone().requires_grad_() for tensor in inputs]
    out = FlexLayout.of(parents, device="cuda").attend(*leaves, None)
    grads = torch.autograd.grad(out, leaves, grad_out)
    want, want_grads = _reference(inputs, grad_out, parents, None)
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)
        else:  # the probability tile is cast to bf16 for the PV product (as in FlashAttention)
            error = float((got.double() - expected).norm() / expected.norm())
            assert error < 1e-2, f"relative error {error:.2e}"


@CUDA
def test_flex_target_logprobs_and_gradients_equal_the_explicit_ones_on_cuda(tiny_lm: Any) -> None:
    model = tiny_lm.to("cuda")
    batch = _packed_batch(BuilderKind.TREE)
    results = []
    for attention in ("explicit", "flex"):
        model.zero_grad(set_to_none=True)
        logprobs = target_logprobs(model, batch, vocab_chunk=1000, attention=attention)
        logprobs.sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs.detach(), grads))
    (explicit, explicit_grads), (flex, flex_grads) = results
    torch.testing.assert_close(flex, explicit, rtol=0, atol=1e-5)
    assert flex_grads.keys() == explicit_grads.keys()
    for name, grad in explicit_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
