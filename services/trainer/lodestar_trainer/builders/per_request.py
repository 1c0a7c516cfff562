"""The `per_request` builder: every call is its own linear sequence (prompt + sampled ids), the baseline.

This is the work a trainer does when it trains each model call separately: every call recomputes its
whole prompt, including everything earlier calls of the session already computed.
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar.policy_versions import call_token_versions
from lodestar.v1 import common_pb2
from lodestar_trainer.data.batch import (
    BuildResult,
    BuildStats,
    Sample,
    TrainingSequence,
    check_call,
    sampled_temperature,
)


def linear_sequence(tokens: list[int]) -> TrainingSequence:
    """A linear sequence over `tokens`: parent t-1, position t, no targets yet."""
    return TrainingSequence(
        token_ids=tokens, parents=list(range(-1, len(tokens) - 1)), position_ids=list(range(len(tokens)))
    )


def add_targets(
    sequence: TrainingSequence, tokens: Sequence[int], sample: Sample, call: common_pb2.CallRecord, first: int
) -> None:
    """Make sequence[tokens] targets of `sample`: the sampled tokens of `call` from its `first` on."""
    count = len(tokens)
    sequence.target_tokens.extend(tokens)
    sequence.target_samples.extend([sample.sample_index] * count)
    sequence.behaviour_logprobs.extend(call.completion_logprobs[first : first + count])
    sequence.advantages.extend([sample.advantage] * count)
    sequence.temperatures.extend([sampled_temperature(call)] * count)
    sequence.versions.extend(call_token_versions(call)[first : first + count])


def add_call_targets(sequence: TrainingSequence, start: int, sample: Sample, call: common_pb2.CallRecord) -> None:
    """Make the sampled tokens of `call`, at sequence[start : start + len(completion)], targets of `sample`."""
    add_targets(sequence, range(start, start + len(call.completion_token_ids)), sample, call, 0)


def call_tokens(samples: Sequence[Sample]) -> int:
    """Tokens in all calls (prompt + sampled): the per-request work, the numerator of every token ratio."""
    return sum(
        len(call.prompt_token_ids) + len(call.completion_token_ids) for sample in samples for call in sample.calls
    )


def build(samples: Sequence[Sample]) -> BuildResult:
    sequences: list[TrainingSequence] = []
    for sample in samples:
        for call in sample.calls:
            check_call(call)
            prompt = list(call.prompt_token_ids)
            sequence = linear_sequence(prompt + list(call.completion_token_ids))
            add_call_targets(sequence, len(prompt), sample, call)
            sequences.append(sequence)
    tokens = sum(len(sequence) for sequence in sequences)
    stats = BuildStats(calls=len(sequences), sequences=len(sequences), call_tokens=tokens, sequence_tokens=tokens)
    return BuildResult(sequences, stats)
