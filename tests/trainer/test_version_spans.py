"""Per-token policy versions in the trainer: calls whose weights were swapped while they ran.

A call with `policy_version_spans` (inference's no-drain swap) was sampled by one version up to a token and
by the next after it. Every builder must give each target the version of its own span (the mismatch metric
compares only the tokens of the version the trainer holds: a stale token differs by the policy's updates,
not by a bug), and a record whose spans do not cover its tokens is refused naming the call, never trained
on with guessed versions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from lodestar.v1 import common_pb2
from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.batch import MicroBatch, Sample, TrainingSequence
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.step.mismatch import MismatchTally

OLD, NEW = 6, 7


def _swapped(call: common_pb2.CallRecord) -> common_pb2.CallRecord:
    """`call` as if the weights went from OLD to NEW at the middle of its sampled tokens."""
    out = common_pb2.CallRecord()
    out.CopyFrom(call)
    count = len(call.completion_token_ids)
    middle = count // 2
    out.policy_version = OLD
    del out.policy_version_spans[:]
    if middle:
        out.policy_version_spans.add(policy_version=OLD, start=0, end=middle)
        out.policy_version_spans.add(policy_version=NEW, start=middle, end=count)
    return out


def _samples() -> list[Sample]:
    samples = synthetic_samples(SMALL_SHAPE, group_size=4, seed=2)
    return [replace(sample, calls=[_swapped(call) for call in sample.calls]) for sample in samples]


def _path(sequence: TrainingSequence, token: int) -> tuple[int, ...]:
    path = []
    while token >= 0:
        path.append(sequence.token_ids[token])
        token = sequence.parents[token]
    return tuple(path[::-1])


def _expected(samples: list[Sample]) -> Counter[tuple[int, tuple[int, ...], int]]:
    """(sample, path to the token, version) of every sampled token, the version read off the call's spans."""
    found: Counter[tuple[int, tuple[int, ...], int]] = Counter()
    for sample in samples:
        for call in sample.calls:
            prompt, completion = list(call.prompt_token_ids), list(call.completion_token_ids)
            middle = len(completion) // 2
            for index in range(len(completion)):
                version = OLD if index < middle else NEW
                found[(sample.sample_index, tuple(prompt + completion[: index + 1]), version)] += 1
    return found


@pytest.mark.parametrize("kind", list(BuilderKind))
def test_every_target_carries_its_own_tokens_version(kind: BuilderKind) -> None:
    samples = _samples()
    result = build_sequences(kind, samples)
    built: Counter[tuple[int, tuple[int, ...], int]] = Counter()
    for sequence in result.sequences:
        for token, sample, version in zip(
            sequence.target_tokens, sequence.target_samples, sequence.versions, strict=True
        ):
            built[(sample, _path(sequence, token), version)] += 1
    assert built == _expected(samples)
    assert {OLD, NEW} <= {version for sequence in result.sequences for version in sequence.versions}


def test_the_mismatch_tally_compares_only_the_tokens_of_the_trainers_version() -> None:
    (sequence,) = build_sequences(BuilderKind.PER_REQUEST, _samples()[:1]).sequences[:1]
    batch = MicroBatch(
        sequence.token_ids, sequence.parents, sequence.position_ids, sequence.target_tokens,
        sequence.target_samples, sequence.behaviour_logprobs, sequence.advantages, [0],
        versions=sequence.versions,
    )  # fmt: skip
    trainer = torch.tensor(sequence.behaviour_logprobs)
    trainer += torch.tensor([1.0 if version == OLD else 0.25 for version in sequence.versions])
    for version, gap in ((NEW, 0.25), (OLD, 1.0)):
        tally = MismatchTally({0: "h"}, version=version)
        tally.add(trainer, batch)
        assert tally.counts["h"] == sequence.versions.count(version)
        assert tally.means()["h"] == pytest.approx(gap)


@pytest.mark.parametrize("kind", list(BuilderKind))
def test_spans_that_do_not_cover_the_tokens_are_refused_naming_the_call(kind: BuilderKind) -> None:
    samples = _samples()
    bad = common_pb2.CallRecord()
    bad.CopyFrom(samples[0].calls[0])
    bad.policy_version_spans[-1].end += 1
    broken = [replace(samples[0], calls=[bad, *samples[0].calls[1:]]), *samples[1:]]
    with pytest.raises(ValueError, match=f"call {bad.session_id}#{bad.sequence}: policy_version_spans cover"):
        build_sequences(kind, broken)
