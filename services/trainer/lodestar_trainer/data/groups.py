"""A rollout Group -> the Samples a builder trains on, with group-relative advantages; bad groups refused.

`group_samples` checks a group before anything is built from it and raises `BadGroupError` naming the
problem: a group of another run, a group with no scored session, a call whose sampled ids and logprobs
differ in length (or that has no prompt or no sampled tokens). Sessions that did not end with a score
(infrastructure failures, cancellations; rollout should not send them) are dropped here, counted, and
never reach the loss. Timed-out sessions are scored by their verifier and are kept.

A group whose rewards are all equal has no signal (every advantage is 0): `GroupSamples.has_signal` is
False and the loop drops it, counted, instead of spending a forward/backward on a zero gradient. A
scored session without any call still counts in its group's rewards (the baseline) but yields no sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_trainer.data.batch import Sample, check_call
from lodestar_trainer.step.advantages import AdvantageKind, group_advantages, has_signal

SCORED = frozenset({rollout_pb2.SESSION_OUTCOME_SCORED, rollout_pb2.SESSION_OUTCOME_TIMED_OUT})


class BadGroupError(InvalidArgumentError):
    """A group the trainer cannot train on; the message says why (the step is skipped)."""


@dataclass(frozen=True)
class GroupSamples:
    group_id: str
    samples: list[Sample]
    rewards: list[float]
    """Reward of every scored session (also those without calls)."""
    has_signal: bool
    min_policy_version: int
    dropped_sessions: int
    """Sessions left out because they were not scored (infra failure, cancelled)."""
    calls: int


def group_samples(
    group: rollout_pb2.Group, *, run_id: str, advantage: AdvantageKind, first_index: int = 0
) -> GroupSamples:
    """The samples of `group`, numbered from `first_index` (BadGroupError when it cannot be trained on)."""
    name = group.group_id or "(no id)"
    if group.run_id != run_id:
        raise BadGroupError(f"group {name} belongs to run {group.run_id!r}, not to the trained run {run_id!r}")
    scored = [session for session in group.sessions if session.outcome in SCORED]
    if not scored:
        raise BadGroupError(f"group {name} has no scored session ({len(group.sessions)} sessions in all)")
    for session in scored:
        for call in session.calls:
            try:
                check_call(call)
            except ValueError as error:
                raise BadGroupError(f"group {name}, session {session.session_id}: {error}") from error
    rewards = [session.reward for session in scored]
    try:
        advantages = group_advantages(rewards, advantage)
    except ValueError as error:
        raise BadGroupError(f"group {name}: {error}") from error
    samples: list[Sample] = []
    for session, reward, value in zip(scored, rewards, advantages, strict=True):
        if not session.calls:
            continue
        calls = sorted(session.calls, key=lambda call: call.sequence)
        samples.append(Sample(first_index + len(samples), session.session_id, reward, value, calls, session.harness))
    versions = [call.policy_version for sample in samples for call in sample.calls]
    return GroupSamples(
        group_id=name,
        samples=samples,
        rewards=rewards,
        has_signal=has_signal(rewards) and bool(samples),
        min_policy_version=min(versions, default=group.min_policy_version),
        dropped_sessions=len(group.sessions) - len(scored),
        calls=sum(len(sample.calls) for sample in samples),
    )
