"""Splitting sequences longer than the micro-batch budget (lodestar_trainer/data/split.py): every target exactly once
with its whole path, parts within the budget, and the same loss and gradients as the unsplit computation on
the tiny model (fp32, to 1e-5) for every builder, up to a 32K-token session under an 8K budget."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import MicroBatch, Sample, TrainingSequence
from lodestar_trainer.data.pack import pack, pack_step
from lodestar_trainer.data.split import split_sequence, split_to_budget
from lodestar_trainer.data.synthetic import SMALL_SHAPE, SessionShape, synthetic_group, synthetic_samples
from lodestar_trainer.step.attention import TreeLayout
from lodestar_trainer.step.forward import target_logprobs
from lodestar_trainer.step.loss import Aggregation, LossConfig, LossNormalizer, LossOutput, policy_loss
from tests.trainer.groups_helpers import group_from_calls
from tests.trainer.helpers import trainer_for

SHAPE = replace(SMALL_SHAPE, logprob_range=(-8.8, -7.8))
"""Branchy short sessions; the random tiny model gives ~-8.3 per token, so ratios straddle the clip bounds."""
TOLERANCE = 1e-5
LONG_SESSION = SessionShape(
    prefix_tokens=1_500,
    task_tokens=100,
    turns=(22, 22),
    tool_result_tokens=(50, 250),
    reply_tokens=(30, 120),
    vocab_size=256,
    subagent_probability=1.0,
    subagent_calls=(4, 8),
    subagent_task_tokens=(50, 200),
    compaction_probability=0.5,
    summary_tokens=(200, 400),
    retry_probability=0.2,
    logprob_range=(-6.0, -5.0),
)
"""One session of a coding agent that delegates every turn to a sub-agent: ~34K tokens as a tree (its calls
hold ~280K), no path from the root longer than ~5.4K. Logprobs near a random model's on 256 tokens (-5.5)."""


# -- packing properties (pure) -----------------------------------------------------------------------------


def _random_tree(rng: random.Random, size: int) -> TrainingSequence:
    """A pre-order tree of `size` tokens (runs that continue, branch off an earlier token, or restart at a
    shallow one) with targets on a third of the non-root tokens, some tokens targeted twice."""
    parents, depths = [-1], [0]
    for token in range(1, size):
        roll = rng.random()
        if roll < 0.8:
            parent = token - 1
        else:  # branch off a token on the path to the previous one (keeps the pre-order)
            path, at = [], token - 1
            while at >= 0:
                path.append(at)
                at = parents[at]
            parent = rng.choice(path)
        parents.append(parent)
        depths.append(depths[parent] + 1)
    sequence = TrainingSequence(token_ids=list(range(size)), parents=parents, position_ids=depths)  # ids: names
    for token in range(1, size):
        for _ in range(2 if rng.random() < 0.05 else int(rng.random() < 0.33)):
            sequence.target_tokens.append(token)
            sequence.target_samples.append(rng.randrange(4))
            sequence.behaviour_logprobs.append(-rng.random())
            sequence.advantages.append(rng.uniform(-1, 1))
            sequence.temperatures.append(rng.choice((1.0, 0.7)))
            sequence.versions.append(rng.randrange(3))
    return sequence


def _path(sequence: TrainingSequence | MicroBatch, token: int) -> tuple[tuple[int, int], ...]:
    """(token id, position) from the root down to `token`."""
    path = []
    while token >= 0:
        path.append((sequence.token_ids[token], sequence.position_ids[token]))
        token = sequence.parents[token]
    return tuple(path[::-1])


def _targets(sequences: list[TrainingSequence]) -> Counter[tuple[Any, ...]]:
    """Every target as (its path, sample, behaviour logprob, advantage, temperature, version), counted."""
    return Counter(
        (_path(s, token), s.target_samples[i], s.behaviour_logprobs[i], s.advantages[i],
         s.temperatures[i] if s.temperatures else None, s.versions[i] if s.versions else None)
        for s in sequences
        for i, token in enumerate(s.target_tokens)
    )  # fmt: skip


def _longest_target_path(sequence: TrainingSequence) -> int:
    return max((len(_path(sequence, token)) for token in sequence.target_tokens), default=0)


@pytest.mark.parametrize("seed", range(6))
def test_every_target_once_with_its_whole_path_and_parts_within_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    sequence = _random_tree(rng, rng.randrange(150, 400))
    deepest = _longest_target_path(sequence)
    for budget in (deepest, deepest + 7, 2 * deepest, len(sequence) - 1, deepest // 2, 5):
        parts, stats = split_to_budget([sequence], budget)
        assert _targets(parts) == _targets([sequence]), budget
        for part in parts:
            TreeLayout.of(part.parents)  # a pre-order forest: what the attention needs
            assert part.target_tokens
            assert all(part.parents[token] >= 0 for token in part.target_tokens)
        if budget >= deepest:
            assert max(len(part) for part in parts) <= budget
            assert stats.over_budget_parts == 0
        else:  # only parts that hold a target deeper than the budget are longer than it
            assert stats.over_budget_parts > 0
            for part in parts:
                assert len(part) <= budget or _longest_target_path(part) > budget
        assert stats.recomputed_tokens == sum(len(part) for part in parts) - len(
            {_path(part, token) for part in parts for token in range(len(part))}
        )
        assert stats.longest_part == max(len(part) for part in parts)
        assert stats.split_sequences == int(len(parts) > 1)
        assert stats.parts == (len(parts) if len(parts) > 1 else 0)
    assert len(split_sequence(sequence, deepest)) >= 2


def test_a_shared_trunk_is_recomputed_for_each_branch() -> None:
    # trunk 0-3, branch 4-7 and branch 8-11 both under token 3; every token but the root is a target
    parents = [-1, 0, 1, 2, 3, 4, 5, 6, 3, 8, 9, 10]
    sequence = TrainingSequence(
        token_ids=list(range(12)), parents=parents, position_ids=[0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7],
        target_tokens=list(range(1, 12)), target_samples=[0] * 11, behaviour_logprobs=[-1.0] * 11,
        advantages=[1.0] * 11,
    )  # fmt: skip
    first, second = split_sequence(sequence, 8)
    assert first.token_ids == list(range(8))
    assert first.target_tokens == list(range(1, 8))
    assert second.token_ids == [0, 1, 2, 3, 8, 9, 10, 11]
    assert second.target_tokens == [4, 5, 6, 7]
    assert second.parents == [-1, 0, 1, 2, 3, 4, 5, 6]
    assert split_to_budget([sequence], 8)[1].recomputed_tokens == 4


def test_a_cut_inside_a_branch_moves_the_branch_head_to_the_next_part() -> None:
    # trunk 0-3, branch 4-7 and branch 8-13 under token 3; the budget (10) runs out at token 10
    parents = [-1, 0, 1, 2, 3, 4, 5, 6, 3, 8, 9, 10, 11, 12]
    depths = [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 8, 9]
    sequence = TrainingSequence(
        token_ids=list(range(14)), parents=parents, position_ids=depths, target_tokens=list(range(4, 14)),
        target_samples=[0] * 10, behaviour_logprobs=[-1.0] * 10, advantages=[1.0] * 10,
    )  # fmt: skip
    first, second = split_sequence(sequence, 10)
    assert first.token_ids == list(range(8))  # not 0-9: 8 and 9 would be context of the next part again
    assert second.token_ids == [0, 1, 2, 3, *range(8, 14)]
    assert split_to_budget([sequence], 10)[1].recomputed_tokens == 4


def test_a_linear_chain_longer_than_the_budget_is_one_part_over_it() -> None:
    """Recompute cannot cut a chain: the part holding its last target holds the whole chain (documented)."""
    size = 25
    chain = TrainingSequence(
        token_ids=list(range(size)), parents=list(range(-1, size - 1)), position_ids=list(range(size)),
        target_tokens=[3, 12, 22], target_samples=[0, 0, 0], behaviour_logprobs=[-1.0] * 3, advantages=[1.0] * 3,
    )  # fmt: skip
    (part,), stats = split_to_budget([chain], 10)
    assert part.token_ids == list(range(23))  # the tail after the last target is context of nothing: dropped
    assert part.target_tokens == [3, 12, 22]
    assert (stats.over_budget_parts, stats.split_sequences, stats.recomputed_tokens) == (1, 0, 0)
    short = replace(chain, target_tokens=[3, 5], target_samples=[0, 0], behaviour_logprobs=[-1.0] * 2,
                    advantages=[1.0] * 2)  # fmt: skip
    (part,) = split_sequence(short, 10)
    assert part.token_ids == list(range(6))  # trimmed to fit


def test_only_the_region_below_the_budget_goes_over_it() -> None:
    """A tree with one deep branch: the shallow branches still get parts within the budget."""
    trunk, shallow, deep = 4, 3, 20
    parents = list(range(-1, trunk - 1))
    for length in (shallow, deep, shallow, shallow):
        parents += [trunk - 1, *range(len(parents), len(parents) + length - 1)]
    depth = [0] * len(parents)
    for token, parent in enumerate(parents):
        depth[token] = depth[parent] + 1 if parent >= 0 else 0
    targets = list(range(1, len(parents)))
    sequence = TrainingSequence(
        token_ids=list(range(len(parents))), parents=parents, position_ids=depth, target_tokens=targets,
        target_samples=[0] * len(targets), behaviour_logprobs=[-1.0] * len(targets), advantages=[1.0] * len(targets),
    )  # fmt: skip
    parts, stats = split_to_budget([sequence], 10)
    assert _targets(parts) == _targets([sequence])
    assert stats.over_budget_parts == 1
    assert sorted(len(part) for part in parts if len(part) > 10) == [trunk + deep]


def test_sequences_that_fit_are_left_alone_and_the_budget_must_be_positive() -> None:
    sequence = _random_tree(random.Random(0), 50)
    assert split_sequence(sequence, 50) == [sequence]
    assert split_sequence(sequence, 50)[0] is sequence
    with pytest.raises(ValueError, match="positive"):
        split_sequence(sequence, 0)


@pytest.mark.parametrize("kind", list(BuilderKind))
def test_pack_splits_to_the_budget_for_every_builder(kind: BuilderKind) -> None:
    samples = synthetic_samples(SHAPE, group_size=4, seed=0)
    sequences = build_sequences(kind, samples).sequences
    deepest = max(_longest_target_path(sequence) for sequence in sequences)
    budget = deepest + 10
    batches, stats = pack_step(sequences, budget)
    assert all(len(batch.token_ids) <= budget for batch in batches)
    assert sum(len(batch.target_tokens) for batch in batches) == sum(len(s.target_tokens) for s in sequences)
    assert stats.over_budget_parts == 0
    if kind is BuilderKind.TREE:  # one tree of ~420 tokens: cut
        assert stats.split_sequences == 1
        assert stats.parts >= 3
        assert stats.recomputed_tokens > 0


# -- gradients equal to the unsplit computation (tiny model) -------------------------------------------------


Step = tuple[LossOutput, dict[str, torch.Tensor], int]
"""A step's merged loss output, gradients by parameter name, and micro-batch count."""


def _step(model: Any, sequences: list[TrainingSequence], budget: int, config: LossConfig, block: int = 64) -> Step:
    """One step over `sequences` packed under `budget` (attention in blocks of `block` queries)."""
    batches = pack(sequences, budget)
    norm = LossNormalizer.of(batches)
    model.zero_grad(set_to_none=True)
    total: LossOutput | None = None
    for batch in batches:
        out = policy_loss(target_logprobs(model, batch, vocab_chunk=1000, attention_block=block), batch, config, norm)
        out.loss.backward()
        total = out if total is None else total.merge(out)
    assert total is not None
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    return total, grads, len(batches)


def _assert_same(split: Step, whole: Step) -> None:
    (out, grads, _), (base, base_grads, _) = split, whole
    assert out.targets == base.targets
    assert out.clipped == base.clipped
    assert float(out.loss) == pytest.approx(float(base.loss), abs=TOLERANCE)
    assert sum(float(grad.norm()) for grad in base_grads.values()) > 1e-2  # a real gradient, not ~0
    assert base_grads.keys() == grads.keys()
    for name, grad in base_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=TOLERANCE, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(BuilderKind))
def test_split_gradients_equal_the_unsplit_ones(tiny_lm: Any, kind: BuilderKind) -> None:
    """One group, sequence-mean aggregation (per-sample normalisers). Trees: a budget that every path fits
    (parts within it) and one below the longest path (over-budget parts too). Linear sequences have one path:
    under a budget shorter than them they stay whole (the documented limit), which must not change the
    gradient either."""
    sequences = build_sequences(kind, synthetic_samples(SHAPE, group_size=4, seed=1)).sequences
    config = LossConfig(aggregation=Aggregation.SEQUENCE_MEAN)
    whole = _step(tiny_lm, sequences, 10**6, config)
    assert whole[2] == 1
    deepest = max(_longest_target_path(sequence) for sequence in sequences)
    for budget in (deepest, deepest // 2) if kind is BuilderKind.TREE else (deepest // 2,):
        _, stats = split_to_budget(sequences, budget)
        assert stats.split_sequences == (kind is BuilderKind.TREE)
        split = _step(tiny_lm, sequences, budget, config)
        assert split[2] >= 3
        _assert_same(split, whole)


def _micro_model() -> Any:
    """A random Qwen3 small enough for 32K tokens on a loaded CPU (1 layer, hidden 16, one head of 8)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=LONG_SESSION.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=8, max_position_embeddings=65_536,
        tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen3ForCausalLM(config).float()


@pytest.mark.slow
def test_a_32k_token_session_trains_under_an_8k_budget() -> None:
    """The session as one tree (tree builder) of ~34K tokens: a step under an 8K budget never computes more than
    8K tokens at once and trains on every sampled token. (The gradient equals the unsplit one: the test above;
    the unsplit pass over 34K tokens would triple this test's time.)"""
    calls = synthetic_group(LONG_SESSION, group_size=1, seed=0)[0]
    sample = Sample(sample_index=0, session_id=calls[0].session_id, reward=1.0, advantage=1.0, calls=calls)
    (tree,) = build_sequences(BuilderKind.TREE, [sample]).sequences
    assert len(tree) >= 32_768
    batches, stats = pack_step([tree], 8_192)
    assert all(len(batch.token_ids) <= 8_192 for batch in batches)
    assert stats.parts == len(batches) >= 4
    assert stats.over_budget_parts == 0
    out, grads, _ = _step(_micro_model(), [tree], 8_192, LossConfig(), block=512)
    assert out.targets == sum(len(call.completion_token_ids) for call in calls)
    assert all(bool(torch.isfinite(grad).all()) for grad in grads.values())
    assert float(grads["model.embed_tokens.weight"].norm()) > 0


@pytest.mark.slow
def test_the_loop_trains_split_trees_and_reports_what_splitting_cost(trainer_model_dir: Path, tmp_path: Path) -> None:
    sessions = synthetic_group(SHAPE, group_size=4, seed=3, group_id="g3")
    group = group_from_calls(sessions, [1.0, 0.0, 0.5, 0.0], group_id="g3")
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [group], steps=1, builder="tree", micro_batch_tokens=160)
    before = trainer.model.lm_head.weight.detach().clone()
    trainer.run()
    assert trainer.board.snapshot().step == 1, trainer.board.snapshot().error
    (values,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert values["split_sequences"] == 1.0
    assert values["split_parts"] >= 3
    assert values["micro_batches"] >= 3
    assert values["recomputed_tokens"] > 0
    assert values["over_budget_parts"] == 0
    assert values["target_tokens"] == sum(len(call.completion_token_ids) for calls in sessions for call in calls)
    assert not torch.equal(trainer.model.lm_head.weight, before)
