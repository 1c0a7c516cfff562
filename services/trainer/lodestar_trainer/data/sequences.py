"""A step's groups -> training sequences: the configured builder once per group, their stats summed; the
`tree` builder once over the whole step, so that what every group shares (a harness's system prompt and
tools, which open every call of every session of a run) is computed once per step, not once per group.
That is exact: a token's logprob depends only on its path from the root, each target keeps its own sample
(indices are unique within a step) and advantage, and the gradient through a shared token is the sum of its
descendants' as it would be in separate trees.

Bad records a builder refuses (ValueError) and token ids outside the model's vocabulary (calls made by
another model) raise BadGroupError, which skips the step like any other bad group (groups.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import BuildStats, TrainingSequence, check_call
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
    for group in groups:  # a bad group is refused by name before anything is built
        _check_group(group, vocab_size)
    if builder == BuilderKind.TREE:
        try:
            result = build_sequences(builder, [sample for group in groups for sample in group.samples])
        except ValueError as error:
            raise BadGroupError(f"groups {', '.join(g.group_id for g in groups)}: {error}") from error
        return result.sequences, result.stats
    sequences: list[TrainingSequence] = []
    totals = BuildStats(calls=0, sequences=0, call_tokens=0, sequence_tokens=0)
    for group in groups:
        try:
            result = build_sequences(builder, group.samples)
        except ValueError as error:
            raise BadGroupError(f"group {group.group_id}: {error}") from error
        sequences.extend(result.sequences)
        totals = add_stats(totals, result.stats)
    return sequences, totals


def _check_group(group: GroupSamples, vocab_size: int) -> None:
    """BadGroupError naming `group` for a call no builder can train on or a token id beyond the vocabulary."""
    if not group.samples:
        raise BadGroupError(f"group {group.group_id}: cannot build sequences from an empty group")
    for sample in group.samples:
        for call in sample.calls:
            try:
                check_call(call)
            except ValueError as error:
                raise BadGroupError(f"group {group.group_id}: {error}") from error
            largest = max((*call.prompt_token_ids, *call.completion_token_ids), default=0)
            if vocab_size and largest >= vocab_size:
                raise BadGroupError(
                    f"group {group.group_id} has token id {largest}, outside the model's vocabulary "
                    f"of {vocab_size} (calls of another model?)"
                )
