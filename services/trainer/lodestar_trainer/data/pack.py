"""Packing: training sequences -> micro-batches of at most `token_budget` tokens (one forward pass each).

A sequence longer than the budget is first split into parts that fit (lodestar_trainer/data/split.py: each part
recomputes the ancestors of its tokens as context, every target stays exactly one loss term, the gradient
is the unsplit one). Then first-fit decreasing: sequences and parts sorted by length (longest first, ties
in input order) go into the first micro-batch with room, else into a new one. Only a part that holds a
target whose path from the root is longer than the budget is longer than it; it goes alone, and its forward
runs in chunks of the budget with KV reuse (`MicroBatch.chunk_tokens`, step/forward.py). The attention
and the vocabulary chunking of lodestar_trainer/step/forward.py keep the memory linear in the micro-batch's
tokens, so the budget bounds the memory of a pass.

Within a micro-batch, sequences are concatenated: parents and targets are offset to global indices, a
root keeps parent -1, so the tree/block-diagonal attention mask follows from `parents` alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar_trainer.data.batch import MicroBatch, TrainingSequence
from lodestar_trainer.data.split import SplitStats, split_to_budget


def _concatenate(sequences: Sequence[TrainingSequence]) -> MicroBatch:
    batch = MicroBatch([], [], [], [], [], [], [], [])
    for sequence in sequences:
        offset = len(batch.token_ids)
        batch.sequence_starts.append(offset)
        batch.token_ids.extend(sequence.token_ids)
        batch.parents.extend(parent + offset if parent >= 0 else -1 for parent in sequence.parents)
        batch.position_ids.extend(sequence.position_ids)
        batch.target_tokens.extend(token + offset for token in sequence.target_tokens)
        batch.target_samples.extend(sequence.target_samples)
        batch.behaviour_logprobs.extend(sequence.behaviour_logprobs)
        batch.advantages.extend(sequence.advantages)
        batch.temperatures.extend(sequence.temperatures)
        batch.versions.extend(sequence.versions)
    return batch


def pack_step(sequences: Sequence[TrainingSequence], token_budget: int) -> tuple[list[MicroBatch], SplitStats]:
    """Micro-batches holding every target of `sequences` exactly once, each at most `token_budget` tokens
    unless it holds a single over-budget part (module docstring), and what splitting did.

    Raises ValueError for a non-positive budget."""
    parts, stats = split_to_budget(sequences, token_budget)
    bins: list[list[TrainingSequence]] = []
    room: list[int] = []
    for sequence in sorted(parts, key=len, reverse=True):
        size = len(sequence)
        for index, free in enumerate(room):
            if size <= free:
                bins[index].append(sequence)
                room[index] -= size
                break
        else:
            bins.append([sequence])
            room.append(token_budget - size)
    batches = [_concatenate(members) for members in bins]
    for batch in batches:
        if len(batch.token_ids) > token_budget:
            batch.chunk_tokens = token_budget  # one part over the budget: its forward runs in chunks of it
    return batches, stats


def pack(sequences: Sequence[TrainingSequence], token_budget: int) -> list[MicroBatch]:
    """The micro-batches of `pack_step`."""
    return pack_step(sequences, token_budget)[0]
