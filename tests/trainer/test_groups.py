"""A rollout Group -> Samples: advantages, numbering, call order, unscored sessions, groups without signal."""

from __future__ import annotations

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_trainer.data.groups import BadGroupError, group_samples
from lodestar_trainer.step.advantages import AdvantageKind
from tests.trainer.groups_helpers import RUN, make_group


def test_samples_carry_group_advantages_and_calls_in_sequence_order() -> None:
    group = make_group(0, rewards=(1.0, 0.0, 0.0, 1.0))
    calls = list(group.sessions[1].calls)
    del group.sessions[1].calls[:]
    group.sessions[1].calls.extend(reversed(calls))  # delivered out of order
    result = group_samples(group, run_id=RUN, advantage=AdvantageKind.MEAN, first_index=10)
    assert [sample.sample_index for sample in result.samples] == [10, 11, 12, 13]
    assert [sample.advantage for sample in result.samples] == [0.5, -0.5, -0.5, 0.5]
    assert [call.sequence for call in result.samples[1].calls] == sorted(call.sequence for call in calls)
    assert result.has_signal
    assert result.calls == sum(len(session.calls) for session in group.sessions)


def test_unscored_sessions_are_dropped_and_counted() -> None:
    outcomes = (
        rollout_pb2.SESSION_OUTCOME_SCORED,
        rollout_pb2.SESSION_OUTCOME_INFRA_FAILED,
        rollout_pb2.SESSION_OUTCOME_TIMED_OUT,
        rollout_pb2.SESSION_OUTCOME_CANCELLED,
    )
    group = make_group(1, rewards=(1.0, 1.0, 0.0, 1.0), outcomes=outcomes)
    result = group_samples(group, run_id=RUN, advantage=AdvantageKind.ZSCORE)
    assert [sample.session_id for sample in result.samples] == ["g1-s0", "g1-s2"]
    assert result.rewards == [1.0, 0.0]
    assert result.dropped_sessions == 2


def test_equal_rewards_have_no_signal() -> None:
    result = group_samples(make_group(2, rewards=(0.3, 0.3, 0.3)), run_id=RUN, advantage=AdvantageKind.ZSCORE)
    assert not result.has_signal
    assert all(sample.advantage == 0.0 for sample in result.samples)


def test_a_scored_session_without_calls_counts_in_the_baseline_only() -> None:
    group = make_group(3, rewards=(1.0, 0.0, 0.0))
    del group.sessions[2].calls[:]
    result = group_samples(group, run_id=RUN, advantage=AdvantageKind.MEAN)
    assert [sample.session_id for sample in result.samples] == ["g3-s0", "g3-s1"]
    assert [round(sample.advantage, 6) for sample in result.samples] == [0.666667, -0.333333]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda group: setattr(group, "run_id", "run-other"), "belongs to run 'run-other', not to the trained run"),
        (lambda group: group.ClearField("sessions"), "has no scored session"),
        (lambda group: group.sessions[0].calls[0].completion_logprobs.pop(), "sampled ids but .* logprobs"),
        (lambda group: group.sessions[1].calls[0].ClearField("prompt_token_ids"), "has no prompt token ids"),
        (lambda group: setattr(group.sessions[0], "reward", float("nan")), "non-finite reward"),
    ],
)
def test_bad_groups_are_refused_with_the_reason(mutate: object, message: str) -> None:
    group = make_group(5)
    mutate(group)  # type: ignore[operator]
    with pytest.raises(BadGroupError, match=message):
        group_samples(group, run_id=RUN, advantage=AdvantageKind.ZSCORE)
