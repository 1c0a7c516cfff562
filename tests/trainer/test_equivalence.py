"""THE builder test: on the same sessions, per_request, prefix_merging and tree give the same loss and the
same gradients (fp32, tiny model, to 1e-5), through the real path: build -> pack -> tree-attention forward
-> chunked log-softmax -> GRPO loss summed over micro-batches -> backward.

The sessions have every kind of branch (sub-agents, compactions, retries), chain breaks and prefixes
repeated across the samples of each group; two groups that share their system prompt (as every session of
a harness's run does) are built as one step (build_step: the tree builder makes one tree of the step) and
packed together; the behaviour logprobs are
near the model's own so that some targets are clipped and some are not; the KL term to a reference
model is on.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.groups import GroupSamples
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.sequences import build_step
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.step.forward import target_logprobs
from lodestar_trainer.step.loss import Aggregation, LossConfig, LossNormalizer, LossOutput, policy_loss

SHAPE = replace(SMALL_SHAPE, logprob_range=(-8.8, -7.8))
"""Branchy short sessions; the random tiny model gives ~-8.3 per token, so ratios straddle the clip bounds."""
TOLERANCE = 1e-5


def _groups() -> list[GroupSamples]:
    """Two groups of 4 synthetic sessions whose calls open with the same system prompt (group 0's)."""
    groups = [
        synthetic_samples(SHAPE, group_size=4, seed=seed, group_id=f"g{seed}", first_sample_index=4 * seed)
        for seed in (0, 1)
    ]
    system = list(groups[0][0].calls[0].prompt_token_ids[: SHAPE.prefix_tokens])
    for sample in groups[1]:
        for call in sample.calls:
            call.prompt_token_ids[: SHAPE.prefix_tokens] = system
    return [
        GroupSamples(f"g{seed}", samples, [s.reward for s in samples], True, 0, 0, sum(len(s.calls) for s in samples))
        for seed, samples in enumerate(groups)
    ]


def _step(
    model: Any, reference: Any, kind: BuilderKind, config: LossConfig
) -> tuple[LossOutput, dict[str, torch.Tensor], int]:
    """One step's loss and gradients under builder `kind` (the model's grads are reset first)."""
    sequences, _ = build_step(_groups(), kind)
    batches = pack(sequences, token_budget=300)
    norm = LossNormalizer.of(batches)
    model.zero_grad(set_to_none=True)
    total: LossOutput | None = None
    for batch in batches:
        new = target_logprobs(model, batch, vocab_chunk=1000, attention_block=32)
        with torch.no_grad():
            ref = target_logprobs(reference, batch, vocab_chunk=1000, attention_block=32)
        out = policy_loss(new, batch, config, norm, ref_logprobs=ref)
        out.loss.backward()
        total = out if total is None else total.merge(out)
    assert total is not None
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    return total, grads, sum(len(batch.token_ids) for batch in batches)


@pytest.mark.parametrize("aggregation", list(Aggregation))
@pytest.mark.slow
def test_three_builders_give_the_same_loss_and_gradients(tiny_lm: Any, aggregation: Aggregation) -> None:
    reference = copy.deepcopy(tiny_lm)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.01 * torch.randn_like(param))
    config = LossConfig(aggregation=aggregation, kl_coef=0.05)
    results = {kind: _step(tiny_lm, reference, kind, config) for kind in BuilderKind}

    base_out, base_grads, base_tokens = results[BuilderKind.PER_REQUEST]
    summary = base_out.summary()
    assert 0.05 < summary["clip_fraction"] < 0.95  # both branches of the clipped surrogate are exercised
    assert summary["kl"] > 0
    assert len(base_grads) == len(list(tiny_lm.parameters()))
    assert sum(float(grad.norm()) for grad in base_grads.values()) > 1e-2  # a real gradient, not ~0
    tokens = {kind: result[2] for kind, result in results.items()}
    assert tokens[BuilderKind.TREE] < tokens[BuilderKind.PREFIX_MERGING] < base_tokens

    for kind in (BuilderKind.PREFIX_MERGING, BuilderKind.TREE):
        out, grads, _ = results[kind]
        assert out.targets == base_out.targets
        assert out.clipped == base_out.clipped
        assert float(out.loss) == pytest.approx(float(base_out.loss), abs=TOLERANCE)
        for name, grad in base_grads.items():
            torch.testing.assert_close(
                grads[name], grad, atol=TOLERANCE, rtol=0, msg=lambda m, n=name, k=kind: f"{k} {n}: {m}"
            )


def test_the_sessions_have_branches_breaks_and_shared_prefixes() -> None:
    """Guards the test above against a generator change that would make it trivial."""
    samples = synthetic_samples(SHAPE, group_size=4, seed=0, group_id="g0")
    merged = build_sequences(BuilderKind.PREFIX_MERGING, samples).stats
    tree = build_sequences(BuilderKind.TREE, samples).stats
    assert merged.merges > 0
    assert merged.breaks >= 2
    assert tree.sequences == 1
    assert tree.sequence_tokens < merged.sequence_tokens


def test_the_tree_of_a_step_computes_the_shared_system_prompt_once() -> None:
    groups = _groups()
    per_group = [build_sequences(BuilderKind.TREE, group.samples).stats for group in groups]
    sequences, step = build_step(groups, BuilderKind.TREE)
    assert [stats.sequences for stats in per_group] == [1, 1]
    assert len(sequences) == step.sequences == 1  # one root: the two groups' trees joined at the system prompt
    assert step.sequence_tokens == sum(stats.sequence_tokens for stats in per_group) - SHAPE.prefix_tokens
    assert step.call_tokens == sum(stats.call_tokens for stats in per_group)
