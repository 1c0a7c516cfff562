"""Packing: every sequence once, the budget held, oversize sequences alone, indices offset correctly."""

from __future__ import annotations

import pytest

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import TrainingSequence
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.step.attention import TreeLayout


def _linear(size: int, marker: int) -> TrainingSequence:
    return TrainingSequence(
        token_ids=[marker] * size,
        parents=list(range(-1, size - 1)),
        position_ids=list(range(size)),
        target_tokens=[size - 1],
        target_samples=[marker],
        behaviour_logprobs=[-1.0],
        advantages=[float(marker)],
    )


def test_first_fit_decreasing_respects_the_budget() -> None:
    sizes = [7, 3, 5, 2, 9, 4, 1, 6]
    batches = pack([_linear(size, marker) for marker, size in enumerate(sizes)], token_budget=10)
    assert all(len(batch.token_ids) <= 10 for batch in batches)
    assert sorted(len(batch.token_ids) for batch in batches) == [7, 10, 10, 10]  # 37 tokens in 4 bins
    markers = sorted(sample for batch in batches for sample in batch.target_samples)
    assert markers == list(range(len(sizes)))


def test_oversize_sequence_goes_alone() -> None:
    batches = pack([_linear(3, 0), _linear(25, 1), _linear(4, 2)], token_budget=10)
    assert [len(batch.token_ids) for batch in batches] == [25, 7]
    assert batches[0].target_samples == [1]


def test_indices_are_offset_and_layout_stays_a_forest() -> None:
    sequences = _linear(4, 1), _linear(3, 2)
    (batch,) = pack(sequences, token_budget=100)
    assert batch.sequence_starts == [0, 4]
    assert batch.parents == [-1, 0, 1, 2, -1, 4, 5]
    assert batch.position_ids == [0, 1, 2, 3, 0, 1, 2]
    assert batch.target_tokens == [3, 6]
    assert batch.token_ids[batch.target_tokens[1]] == 2


def test_packed_trees_keep_their_targets_and_pre_order() -> None:
    sequences = []
    for group in range(3):
        samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=group, group_id=f"g{group}")
        sequences += build_sequences(BuilderKind.TREE, samples).sequences
    batches = pack(sequences, token_budget=400)
    assert sum(len(batch.target_tokens) for batch in batches) == sum(len(s.target_tokens) for s in sequences)
    for batch in batches:
        TreeLayout.of(batch.parents)  # raises when a packed tree is not pre-order
        assert all(batch.parents[target] >= 0 for target in batch.target_tokens)


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        pack([_linear(2, 0)], token_budget=0)
