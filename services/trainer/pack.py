"""Packing: training sequences -> micro-batches of at most `token_budget` tokens (one forward pass each).

First-fit decreasing: sequences sorted by length (longest first, ties in input order) go into the first
micro-batch with room, else into a new one. A sequence longer than the budget is never split: it goes
alone into its own micro-batch (a tree is computed whole; splitting it into subtrees that re-include
their ancestors would recompute the shared prefix, which is the work the tree builder exists to save).
The caller sizes the budget so that the longest sequence fits in memory; the attention and the
vocabulary chunking of services/trainer/forward.py keep the memory linear in the micro-batch's tokens.

Within a micro-batch, sequences are concatenated: parents and targets are offset to global indices, a
root keeps parent -1, so the tree/block-diagonal attention mask follows from `parents` alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.trainer.batch import MicroBatch, TrainingSequence


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


def pack(sequences: Sequence[TrainingSequence], token_budget: int) -> list[MicroBatch]:
    """Micro-batches holding every sequence exactly once; each at most `token_budget` tokens unless it holds
    a single longer sequence. Raises ValueError for a non-positive budget."""
    if token_budget <= 0:
        raise ValueError(f"token budget must be positive, got {token_budget}")
    bins: list[list[TrainingSequence]] = []
    room: list[int] = []
    for sequence in sorted(sequences, key=len, reverse=True):
        size = len(sequence)
        for index, free in enumerate(room):
            if size <= free:
                bins[index].append(sequence)
                room[index] -= size
                break
        else:
            bins.append([sequence])
            room.append(token_budget - size)
    return [_concatenate(members) for members in bins]
