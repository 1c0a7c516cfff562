"""A micro-batch longer than the budget (a path from the root longer than it: one long linear session) runs in
chunks of the budget with KV reuse (step/forward.py, attention.py `ChunkLayout`): the logprobs and every
gradient element equal the one-pass ones (fp32, the explicit attention, as the split tests check for trees)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from lodestar_trainer.data.batch import MicroBatch, TrainingSequence
from lodestar_trainer.data.pack import pack_step
from lodestar_trainer.model import enable_activation_checkpointing
from lodestar_trainer.step.attention import TreeLayout, tree_attention
from lodestar_trainer.step.forward import target_logprobs
from tests.trainer.attention_support import random_forest


def _sequence(parents: list[int], vocab: int, seed: int) -> TrainingSequence:
    """Random tokens on `parents`; every token with a parent is a target (advantages and logprobs unused)."""
    generator = torch.Generator().manual_seed(seed)
    depth: list[int] = []
    for parent in parents:
        depth.append(depth[parent] + 1 if parent >= 0 else 0)
    targets = [token for token, parent in enumerate(parents) if parent >= 0]
    return TrainingSequence(
        token_ids=torch.randint(0, vocab, (len(parents),), generator=generator).tolist(),
        parents=parents,
        position_ids=depth,
        target_tokens=targets,
        target_samples=[0] * len(targets),
        behaviour_logprobs=[0.0] * len(targets),
        advantages=[1.0] * len(targets),
    )


def _logprobs_and_grads(model: Any, batch: MicroBatch, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    logprobs = target_logprobs(model, batch, vocab_chunk=1000)
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_chunked_equals_one_pass(model: Any, batch: MicroBatch) -> None:
    weights = torch.randn(len(batch.target_tokens), generator=torch.Generator().manual_seed(3))
    chunked, chunked_grads = _logprobs_and_grads(model, batch, weights)
    whole, whole_grads = _logprobs_and_grads(model, dataclasses.replace(batch, chunk_tokens=0), weights)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    assert chunked_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_linear_session_over_the_budget_is_packed_to_run_in_chunks_of_it(tiny_lm: Any) -> None:
    """600 tokens in one linear chain under a 256-token budget: one micro-batch (recompute cannot cut one path),
    run as chunks of 256, 256 and 88 queries over the keys before them; the same logprobs and gradients."""
    sequence = _sequence(list(range(-1, 599)), tiny_lm.config.vocab_size, seed=1)
    (batch,), stats = pack_step([sequence], token_budget=256)
    assert batch.chunk_tokens == 256
    assert stats.over_budget_parts == 1
    _assert_chunked_equals_one_pass(tiny_lm, batch)


@pytest.mark.slow
def test_chunks_with_activation_checkpointing_keep_the_gradient(tiny_lm: Any) -> None:
    """The CUDA default: every layer recomputed in the backward, the earlier chunks' keys and values still
    reaching the chunks that made them."""
    enable_activation_checkpointing(tiny_lm)
    sequence = _sequence(list(range(-1, 399)), tiny_lm.config.vocab_size, seed=2)
    (batch,), _ = pack_step([sequence], token_budget=128)
    assert batch.chunk_tokens == 128
    _assert_chunked_equals_one_pass(tiny_lm, batch)


@pytest.mark.slow
def test_a_tree_deeper_than_the_chunk_runs_in_chunks_too(tiny_lm: Any) -> None:
    sequence = _sequence(random_forest(500, seed=4), tiny_lm.config.vocab_size, seed=3)
    (batch,), _ = pack_step([sequence], token_budget=100_000)
    _assert_chunked_equals_one_pass(tiny_lm, dataclasses.replace(batch, chunk_tokens=150))


@pytest.mark.parametrize("start", [0, 100, 256, 300])
def test_queries_from_an_offset_attend_as_the_same_rows_of_the_whole(start: int) -> None:
    """TreeLayout with `start`: queries start..T-1 over every key give those rows of the full attention, and
    the gradients of q (those rows), k and v (from those rows' loss) match (fp64)."""
    parents = random_forest(400, seed=6)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, 400, 16, dtype=torch.float64) for heads in (4, 2, 2))
    grad = torch.randn(1, 4, 400 - start, 16, dtype=torch.float64)
    results = []
    for layout, rows in ((TreeLayout.of(parents, block=64, start=start), slice(start, None)), (None, None)):
        leaves = [tensor.clone().requires_grad_() for tensor in (q[:, :, rows] if rows else q, k, v)]
        if layout is None:
            out = tree_attention(*leaves, TreeLayout.of(parents, block=64), 0.25)[:, :, start:]
        else:
            out = tree_attention(*leaves, layout, 0.25)
        grads = torch.autograd.grad(out, leaves, grad)
        results.append((out, grads[0][:, :, -(400 - start) :], grads[1], grads[2]))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
