"""A step's groups -> training sequences: the configured builder once per group, their stats summed.

Bad records a builder refuses (ValueError) and token ids outside the model's vocabulary (calls made by
another model) raise BadGroupError, which skips the step like any other bad group (groups.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import BuildStats, TrainingSequence
from lodestar_trainer.data.groups import BadGroupError, GroupSamples


def add_stats(a: BuildStats, b: BuildStats) -> BuildStats:
    return BuildStats(
        calls=a.calls + b.calls,
        sequences=a.sequences + b.sequences,
        call_tokens=a.call_tokens + b.call_tokens,
        sequence_tokens=a.sequence_tokens + b.sequence_tokens,
        merges=a.merges + b.merges,
        breaks=a.breaks + b.breaks,
    )


def build_step(
    groups: Sequence[GroupSamples], builder: BuilderKind, vocab_size: int = 0
) -> tuple[list[TrainingSequence], BuildStats]:
    """Every group's sequences and the summed stats (`vocab_size` 0: token ids unchecked)."""
    sequences: list[TrainingSequence] = []
    totals = BuildStats(calls=0, sequences=0, call_tokens=0, sequence_tokens=0)
    for group in groups:
        try:
            result = build_sequences(builder, group.samples)
        except ValueError as error:
            raise BadGroupError(f"group {group.group_id}: {error}") from error
        largest = max((max(sequence.token_ids, default=0) for sequence in result.sequences), default=0)
        if vocab_size and largest >= vocab_size:
            raise BadGroupError(
                f"group {group.group_id} has token id {largest}, outside the model's vocabulary "
                f"of {vocab_size} (calls of another model?)"
            )
        sequences.extend(result.sequences)
        totals = add_stats(totals, result.stats)
    return sequences, totals
