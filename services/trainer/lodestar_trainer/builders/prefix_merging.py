"""The `prefix_merging` builder: a call whose prompt extends an earlier sequence of its session is appended.

Within one session, calls are taken in sequence order. A call whose prompt ids start with all the ids of
an earlier sequence of the same session (that sequence's prompts and sampled ids so far) extends it: the
new prompt tail is appended (no loss on it) and then its sampled ids (targets). When several sequences
qualify, the longest wins. A call that extends nothing starts a new sequence; no call is ever dropped.
A call that starts a new sequence although its session already had one is a *break* (compaction,
sub-agent chains, retries, or a chain the gateway could not continue token-faithfully).

Sequences never cross sessions: sharing the prefixes of a group's samples is the `tree` builder's job.
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar_trainer.builders.per_request import add_call_targets, call_tokens, linear_sequence
from lodestar_trainer.data.batch import BuildResult, BuildStats, Sample, TrainingSequence, check_call


def _extended(open_sequences: list[TrainingSequence], prompt: list[int]) -> TrainingSequence | None:
    """The longest open sequence whose tokens are a prefix of `prompt`, if any."""
    best: TrainingSequence | None = None
    for sequence in open_sequences:
        size = len(sequence.token_ids)
        if size <= len(prompt) and (best is None or size > len(best.token_ids)) and prompt[:size] == sequence.token_ids:
            best = sequence
    return best


def build(samples: Sequence[Sample]) -> BuildResult:
    sequences: list[TrainingSequence] = []
    merges = breaks = calls = 0
    for sample in samples:
        session: list[TrainingSequence] = []
        for call in sorted(sample.calls, key=lambda record: record.sequence):
            check_call(call)
            calls += 1
            prompt = list(call.prompt_token_ids)
            completion = list(call.completion_token_ids)
            sequence = _extended(session, prompt)
            if sequence is None:
                breaks += 1 if session else 0
                sequence = linear_sequence(prompt + completion)
                session.append(sequence)
            else:
                merges += 1
                start = len(sequence.token_ids)
                sequence.token_ids.extend(prompt[start:] + completion)
                sequence.parents.extend(range(start - 1, len(sequence.token_ids) - 1))
                sequence.position_ids.extend(range(start, len(sequence.token_ids)))
            add_call_targets(sequence, len(prompt), sample, call)
        sequences.extend(session)
    stats = BuildStats(
        calls=calls,
        sequences=len(sequences),
        call_tokens=call_tokens(samples),
        sequence_tokens=sum(len(sequence) for sequence in sequences),
        merges=merges,
        breaks=breaks,
    )
    return BuildResult(sequences, stats)
