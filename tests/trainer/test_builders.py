"""Builders: the structure of what each builds, that every sampled token is one target, and bad records."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from lodestar.v1 import common_pb2
from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import Sample, TrainingSequence
from lodestar_trainer.data.synthetic import SMALL_SHAPE, SessionShape, synthetic_samples

LINEAR = replace(SMALL_SHAPE, subagent_probability=0.0, compaction_probability=0.0, retry_probability=0.0)


def _path_to(sequence: TrainingSequence, token: int) -> list[int]:
    """Token ids from the root to `token` (inclusive), following parents."""
    path = []
    while token >= 0:
        path.append(sequence.token_ids[token])
        token = sequence.parents[token]
    return path[::-1]


def _targets(samples: list[Sample]) -> Counter[tuple[int, tuple[int, ...], float, float]]:
    """(sample, path up to the token, behaviour logprob, advantage) of every sampled token of every call."""
    found: Counter[tuple[int, tuple[int, ...], float, float]] = Counter()
    for sample in samples:
        for call in sample.calls:
            prompt, completion = list(call.prompt_token_ids), list(call.completion_token_ids)
            for index, logprob in enumerate(call.completion_logprobs):
                found[(sample.sample_index, tuple(prompt + completion[: index + 1]), logprob, sample.advantage)] += 1
    return found


def _built_targets(sequences: list[TrainingSequence]) -> Counter[tuple[int, tuple[int, ...], float, float]]:
    found: Counter[tuple[int, tuple[int, ...], float, float]] = Counter()
    for sequence in sequences:
        for token, sample, logprob, advantage in zip(
            sequence.target_tokens,
            sequence.target_samples,
            sequence.behaviour_logprobs,
            sequence.advantages,
            strict=True,
        ):
            found[(sample, tuple(_path_to(sequence, token)), logprob, advantage)] += 1
    return found


def _group(seed: int = 1, shape: SessionShape = SMALL_SHAPE, size: int = 4) -> list[Sample]:
    return synthetic_samples(shape, group_size=size, seed=seed)


@pytest.mark.parametrize("kind", list(BuilderKind))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_sampled_token_is_exactly_one_target_on_its_own_path(kind: BuilderKind, seed: int) -> None:
    samples = _group(seed)
    result = build_sequences(kind, samples)
    assert _built_targets(result.sequences) == _targets(samples)
    for sequence in result.sequences:
        depth = [0] * len(sequence)
        for token, parent in enumerate(sequence.parents):
            assert parent < token
            depth[token] = depth[parent] + 1 if parent >= 0 else 0
        assert sequence.position_ids == depth


def test_per_request_is_one_linear_sequence_per_call() -> None:
    samples = _group()
    result = build_sequences(BuilderKind.PER_REQUEST, samples)
    calls = [call for sample in samples for call in sample.calls]
    assert len(result.sequences) == result.stats.calls == len(calls)
    assert all(sequence.is_linear for sequence in result.sequences)
    assert result.stats.token_ratio == 1.0


def test_prefix_merging_turns_a_linear_session_into_one_sequence() -> None:
    samples = _group(shape=LINEAR)
    result = build_sequences(BuilderKind.PREFIX_MERGING, samples)
    assert len(result.sequences) == len(samples)
    assert all(sequence.is_linear for sequence in result.sequences)
    calls = sum(len(sample.calls) for sample in samples)
    assert result.stats.merges == calls - len(samples)
    assert result.stats.breaks == 0
    # each session's sequence is its last call's prompt + sampled ids
    for sample, sequence in zip(samples, result.sequences, strict=True):
        last = sample.calls[-1]
        assert sequence.token_ids == [*last.prompt_token_ids, *last.completion_token_ids]


def test_prefix_merging_counts_breaks_and_never_drops_a_call() -> None:
    samples = _group(seed=3)
    result = build_sequences(BuilderKind.PREFIX_MERGING, samples)
    calls = sum(len(sample.calls) for sample in samples)
    assert result.stats.calls == calls
    assert result.stats.merges + result.stats.sequences == calls
    assert result.stats.breaks == result.stats.sequences - len(samples)
    assert result.stats.breaks > 0  # the seed has compactions, sub-agents and retries
    per_request = build_sequences(BuilderKind.PER_REQUEST, samples).stats
    assert per_request.sequence_tokens > result.stats.sequence_tokens
    assert result.stats.call_tokens == per_request.call_tokens


def test_tree_shares_the_group_prefix_once() -> None:
    samples = _group(seed=3)
    result = build_sequences(BuilderKind.TREE, samples)
    assert len(result.sequences) == 1  # the group shares its system+tools+task prefix
    paths = {
        tuple([*call.prompt_token_ids, *call.completion_token_ids][:end])
        for sample in samples
        for call in sample.calls
        for end in range(1, len(call.prompt_token_ids) + len(call.completion_token_ids) + 1)
    }
    assert result.stats.sequence_tokens == len(paths)  # one token per distinct prefix: nothing twice
    merged = build_sequences(BuilderKind.PREFIX_MERGING, samples).stats
    assert result.stats.sequence_tokens < merged.sequence_tokens
    assert result.stats.token_ratio > merged.token_ratio


def test_tree_gives_identical_replies_of_two_samples_one_node_and_two_targets() -> None:
    call = common_pb2.CallRecord(
        session_id="a",
        sequence=0,
        prompt_token_ids=[5, 6, 7],
        completion_token_ids=[8, 9],
        completion_logprobs=[-1.0, -2.0],
    )
    twin = common_pb2.CallRecord()
    twin.CopyFrom(call)
    twin.session_id = "b"
    samples = [Sample(0, "a", 1.0, 1.0, [call]), Sample(1, "b", 0.0, -1.0, [twin])]
    (sequence,) = build_sequences(BuilderKind.TREE, samples).sequences
    assert sequence.token_ids == [5, 6, 7, 8, 9]
    assert sorted(zip(sequence.target_tokens, sequence.target_samples, strict=True)) == [(3, 0), (3, 1), (4, 0), (4, 1)]


def test_tree_starts_a_new_root_for_a_call_that_shares_nothing() -> None:
    calls = [
        common_pb2.CallRecord(
            session_id="a", sequence=0, prompt_token_ids=[1, 2], completion_token_ids=[3], completion_logprobs=[-1.0]
        ),
        common_pb2.CallRecord(
            session_id="a", sequence=1, prompt_token_ids=[9, 2], completion_token_ids=[3], completion_logprobs=[-1.0]
        ),
    ]
    result = build_sequences(BuilderKind.TREE, [Sample(0, "a", 1.0, 1.0, calls)])
    assert [sequence.token_ids for sequence in result.sequences] == [[1, 2, 3], [9, 2, 3]]
    assert result.stats.breaks == 1


@pytest.mark.parametrize("kind", list(BuilderKind))
def test_bad_records_raise_naming_the_call(kind: BuilderKind) -> None:
    samples = _group()
    bad = common_pb2.CallRecord()
    bad.CopyFrom(samples[1].calls[1])
    del bad.completion_logprobs[-1]
    broken = [samples[0], replace(samples[1], calls=[samples[1].calls[0], bad])]
    with pytest.raises(ValueError, match=f"call {bad.session_id}#{bad.sequence} has"):
        build_sequences(kind, broken)
    empty = common_pb2.CallRecord(session_id="x", sequence=4, prompt_token_ids=[1])
    with pytest.raises(ValueError, match="call x#4 has no sampled tokens"):
        build_sequences(kind, [replace(samples[0], calls=[empty])])
    with pytest.raises(ValueError, match="empty group"):
        build_sequences(kind, [])
