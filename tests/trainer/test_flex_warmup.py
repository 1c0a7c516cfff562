"""FlexAttention compiled at start-up (step/flex.py `warm_up`): every bucket of the token budget, so no step
compiles; a budget past the recompile limit refused before any compile. CPU runs flex forward only (no
backward there), so the grad mode's compile is left to the CUDA test and bench/gpu_check.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.step.flex import (
    RECOMPILE_LIMIT,
    AttentionShape,
    FlexLayout,
    buckets,
    flex_tree_attention,
    padded_length,
    warm_up,
)
from tests.trainer.attention_support import random_forest

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_buckets_are_every_padded_length_within_the_budget() -> None:
    assert buckets(8192) == [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert buckets(100) == [128]
    assert buckets(5000) == [*buckets(4096), 6144]
    assert {padded_length(size) for size in range(1, 5001)} == set(buckets(5000))


def test_a_budget_past_the_recompile_limit_is_refused_before_compiling() -> None:
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=64, scale=0.125)
    budget = 128 * 2 ** (RECOMPILE_LIMIT // 2)  # two buckets per octave: more than the limit allows
    with pytest.raises(InvalidArgumentError, match=r"lower batch\.micro_batch_tokens"):
        warm_up(shape, budget=budget, device="cpu", dtype=torch.float32, grad_modes=(True, False))


def test_the_shape_is_the_models(tiny_lm: Any) -> None:
    shape = AttentionShape.of(tiny_lm)
    config = tiny_lm.config
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    assert shape.scale == pytest.approx(config.head_dim**-0.5)


def _attend(size: int, shape: AttentionShape, seed: int) -> torch.Tensor:
    """flex attention as the model calls it: q, k, v transposed views of [1, T, H, D] (not contiguous)."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(1, size, heads, shape.head_dim).transpose(1, 2) for heads in (4, 2, 2))
    return flex_tree_attention(q, k, v, FlexLayout.of(random_forest(size, seed), device="cpu"), shape.scale)


@pytest.mark.slow
def test_after_the_warm_up_no_micro_batch_within_the_budget_compiles() -> None:
    """Warmed for a budget of 200 (buckets 128 and 256), lengths 60, 128, 129 and 200 run with dynamo set to
    raise on any recompile; a length past the budget (bucket 384) would compile, so the check can fail."""
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=64, scale=0.125)
    torch._dynamo.reset()
    with torch.no_grad():
        assert warm_up(shape, budget=200, device="cpu", dtype=torch.float32, grad_modes=(False,)) == 2
        config: Any = torch._dynamo.config
        with config.patch(error_on_recompile=True):
            for seed, size in enumerate((60, 128, 129, 200)):
                assert _attend(size, shape, seed).shape == (1, 4, size, 64)
            with pytest.raises(Exception, match=r"[Rr]ecompil"):
                _attend(300, shape, 9)


@CUDA
def test_after_the_warm_up_a_training_micro_batch_compiles_nothing_on_cuda() -> None:
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=64, scale=0.125)
    torch._dynamo.reset()
    assert warm_up(shape, budget=300, device="cuda", dtype=torch.bfloat16) == 3
    config: Any = torch._dynamo.config
    with config.patch(error_on_recompile=True):
        q, k, v = (
            torch.randn(1, 250, heads, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
            for heads in (4, 2, 2)
        )
        out = flex_tree_attention(q, k, v, FlexLayout.of(random_forest(250, 3), device="cuda"), shape.scale)
        torch.autograd.backward(out.float().sum())
