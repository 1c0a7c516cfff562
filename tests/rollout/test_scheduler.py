"""The scheduler's rules as pure logic (no etcd, no gRPC): ordering, fencing, early stop, retries."""

from __future__ import annotations

import pytest

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_rollout import groups
from lodestar_rollout.model import GroupStatus, SessionStatus
from lodestar_rollout.scheduler import MISSED_POLLS_LIMIT, Progress, Scheduler
from lodestar_rollout.spec import with_defaults
from tests.rollout.helpers import CANCELLED, INFRA_FAILED, TIMED_OUT, make_spec, session_result


def _scheduler(**spec_fields: object) -> tuple[Scheduler, str]:
    scheduler = Scheduler()
    scheduler.add_run("r", with_defaults(make_spec(**spec_fields)), 0.0)  # type: ignore[arg-type]
    return scheduler, "r"


def test_hand_out_oldest_group_first_and_requeued_sessions_before_new_groups() -> None:
    scheduler, _ = _scheduler(tasks=3, group_size=2)
    first = scheduler.acquire("a", 1, 3, [], 0.0).assigned
    assert [s.session_id for s in first] == ["r-g0-s0", "r-g0-s1", "r-g1-s0"]
    scheduler.complete(session_result("r-g0-s1", 1, "a", INFRA_FAILED), 1.0)
    second = scheduler.acquire("b", 2, 2, [], 1.0).assigned
    assert [(s.session_id, s.attempt) for s in second] == [("r-g0-s1", 2), ("r-g1-s1", 1)]


def test_a_result_from_a_superseded_attempt_or_another_node_is_refused() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=2)
    scheduler.acquire("a", 1, 1, [], 0.0)
    scheduler.lose("r-g0-s0", 1, "lease ended", 1.0)
    assert scheduler.sessions["r-g0-s0"].status is SessionStatus.PENDING
    with pytest.raises(FailedPreconditionError):  # requeued: attempt 1 is dead even before attempt 2 exists
        scheduler.complete(session_result("r-g0-s0", 1, "a"), 2.0)
    (again,) = scheduler.acquire("b", 2, 1, [], 2.0).assigned
    assert (again.session_id, again.attempt) == ("r-g0-s0", 2)
    with pytest.raises(FailedPreconditionError):
        scheduler.complete(session_result("r-g0-s0", 1, "a"), 3.0)
    with pytest.raises(FailedPreconditionError):
        scheduler.complete(session_result("r-g0-s0", 2, "a"), 3.0)  # right attempt, wrong node
    counted, _ = scheduler.complete(session_result("r-g0-s0", 2, "b"), 3.0)
    assert counted
    repeated, changes = scheduler.complete(session_result("r-g0-s0", 2, "b"), 4.0)
    assert repeated  # a repeated report is answered the same and changes nothing
    assert not changes
    with pytest.raises(InvalidArgumentError):
        scheduler.complete(session_result("r-g0-s1", 0, "a", outcome=0), 4.0)


def test_early_stop_completes_the_group_and_cancels_the_rest_on_their_nodes() -> None:
    scheduler, _ = _scheduler(tasks=2, group_size=4, early_stop_fraction=0.5)
    assigned = scheduler.acquire("a", 1, 4, [], 0.0).assigned
    scheduler.complete(session_result("r-g0-s0", 1, "a", versions=(3, 5)), 1.0)
    assert scheduler.groups["r-g0"].status is GroupStatus.OPEN
    _, changes = scheduler.complete(session_result("r-g0-s2", 1, "a", TIMED_OUT, versions=(4,)), 1.0)
    group = scheduler.groups["r-g0"]
    assert (group.status, group.completion_seq, group.min_policy_version, group.max_policy_version) == (
        GroupStatus.COMPLETE,
        1,
        3,
        5,
    )
    assert sorted(changes.released) == [("r-g0-s1", 1), ("r-g0-s2", 1), ("r-g0-s3", 1)]
    still = [Progress(s.session_id, s.attempt, rollout_pb2.SESSION_STAGE_RUN) for s in assigned[1:4:2]]
    polled = scheduler.acquire("a", 1, 0, still, 2.0)
    assert polled.cancelled == [("r-g0-s1", 1), ("r-g0-s3", 1)]
    late, _ = scheduler.complete(session_result("r-g0-s3", 1, "a"), 3.0)
    assert not late  # recorded, not counted
    assert scheduler.sessions["r-g0-s3"].status is SessionStatus.CANCELLED


def test_infra_failures_are_retried_then_the_session_fails_and_the_group_completes_with_what_scored() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=2, max_attempts=2)
    scheduler.acquire("a", 1, 2, [], 0.0)
    scheduler.complete(session_result("r-g0-s0", 1, "a", reward=0.5), 1.0)
    scheduler.complete(session_result("r-g0-s1", 1, "a", INFRA_FAILED), 1.0)
    assert scheduler.sessions["r-g0-s1"].status is SessionStatus.PENDING
    (retry,) = scheduler.acquire("a", 1, 2, [], 1.0).assigned
    assert retry.attempt == 2
    scheduler.complete(session_result("r-g0-s1", 2, "a", INFRA_FAILED), 2.0)
    assert scheduler.sessions["r-g0-s1"].status is SessionStatus.FAILED
    assert scheduler.groups["r-g0"].status is GroupStatus.COMPLETE
    assert groups.scored_session_ids(scheduler, scheduler.groups["r-g0"]) == ["r-g0-s0"]
    assert scheduler.runs["r"].state == rollout_pb2.RUN_STATE_COMPLETED
    assert scheduler.runs["r"].infra_failures == 2


def test_a_group_where_nothing_scored_fails() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=1, max_attempts=1)
    scheduler.acquire("a", 1, 1, [], 0.0)
    scheduler.complete(session_result("r-g0-s0", 1, "a", INFRA_FAILED), 1.0)
    assert scheduler.groups["r-g0"].status is GroupStatus.FAILED
    assert scheduler.runs["r"].state == rollout_pb2.RUN_STATE_COMPLETED
    assert groups.next_group(scheduler, scheduler.runs["r"], 0)[0] is None


def test_a_node_cancelling_on_its_own_requeues_without_counting_a_failure() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=1, max_attempts=1)
    scheduler.acquire("a", 1, 1, [], 0.0)
    scheduler.complete(session_result("r-g0-s0", 1, "a", CANCELLED), 1.0)
    session = scheduler.sessions["r-g0-s0"]
    assert (session.status, session.failures) == (SessionStatus.PENDING, 0)


def test_attempts_a_node_stops_listing_are_lost_after_two_polls_and_stages_are_tracked() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=2)
    scheduler.acquire("a", 1, 2, [], 0.0)
    ready = [Progress("r-g0-s0", 1, rollout_pb2.SESSION_STAGE_READY), Progress("r-g0-s1", 1)]
    scheduler.acquire("a", 1, 0, ready, 1.0)
    assert scheduler.sessions["r-g0-s0"].stage == rollout_pb2.SESSION_STAGE_READY
    for poll in range(MISSED_POLLS_LIMIT):
        result = scheduler.acquire("a", 1, 0, ready[:1], 2.0 + poll)
    assert result.cancelled == [("r-g0-s1", 1)]
    assert scheduler.sessions["r-g0-s1"].status is SessionStatus.PENDING
    assert scheduler.sessions["r-g0-s0"].status is SessionStatus.RUNNING


def test_reconcile_loses_running_attempts_without_a_key_and_reports_stale_keys() -> None:
    scheduler, _ = _scheduler(tasks=1, group_size=2)
    scheduler.acquire("a", 1, 2, [], 0.0)
    changes, stale = scheduler.reconcile({("r-g0-s0", 1): "a", ("r-g0-s9", 1): "a"}, 1.0)
    assert [a.session_id for a in changes.attempts] == ["r-g0-s1"]
    assert stale == [("r-g0-s9", 1)]
    assert scheduler.sessions["r-g0-s1"].status is SessionStatus.PENDING


def test_stream_order_skips_stale_groups_once_and_resumes_after_a_count() -> None:
    scheduler, _ = _scheduler(tasks=3, group_size=1, max_staleness=1)
    scheduler.acquire("a", 1, 3, [], 0.0)
    for task, version in ((2, 5), (0, 1), (1, 4)):  # completion order: g2, g0, g1
        scheduler.complete(session_result(f"r-g{task}-s0", 1, "a", versions=(version,)), 1.0)
    scheduler.policy_version = 5
    run = scheduler.runs["r"]
    first, _ = groups.next_group(scheduler, run, 0)
    assert first is not None
    assert first.group_id == "r-g2"
    assert (run.groups_delivered, run.groups_dropped) == (1, 0)  # nothing decided beyond what is sent
    second, _ = groups.next_group(scheduler, run, 1)
    assert second is not None
    assert second.group_id == "r-g1"  # r-g0 (version 1) is 4 behind 5: dropped on the way
    assert (run.groups_delivered, run.groups_dropped) == (2, 1)
    scheduler.policy_version = 100  # decisions already made stay made
    again, _ = groups.next_group(scheduler, run, 1)
    assert again is None  # delivered already: the service reads it back from the store
    assert (run.groups_delivered, run.groups_dropped) == (2, 1)
    assert groups.next_group(scheduler, run, 2)[0] is None


def test_new_groups_wait_while_the_trainer_is_behind_but_started_groups_go_on() -> None:
    scheduler, _ = _scheduler(tasks=9, group_size=2)
    run = scheduler.runs["r"]
    scheduler.report_policy_version(1)
    assert len(scheduler.acquire("a", 1, 4, [], 0.0).assigned) == 4  # no pace known yet: no limit
    for task in (0, 1):
        for sample in (0, 1):
            scheduler.complete(session_result(f"r-g{task}-s{sample}", 1, "a"), 1.0)
    for sent in range(2):
        assert groups.next_group(scheduler, run, sent)[0] is not None
    scheduler.report_policy_version(2)  # the trainer took 2 groups in one version
    assert run.batch_estimate == 2
    assert run.groups_in_play == 0
    first = scheduler.acquire("b", 1, 10, [], 2.0).assigned  # (each call from a new node: no in_flight needed)
    assert [s.session_id for s in first] == [f"r-g{t}-s{s}" for t in (2, 3, 4, 5, 6) for s in (0, 1)]  # 2.5 batches
    scheduler.complete(session_result("r-g2-s1", 1, "b", INFRA_FAILED), 3.0)
    (retry,) = scheduler.acquire("c", 1, 10, [], 3.0).assigned
    assert (retry.session_id, retry.attempt) == ("r-g2-s1", 2)  # a started group is never held back
    scheduler.complete(session_result("r-g2-s0", 1, "b"), 4.0)
    scheduler.complete(session_result("r-g2-s1", 2, "c"), 4.0)
    assert scheduler.acquire("d", 1, 10, [], 4.0).assigned == []  # complete but not delivered: still in play
    assert groups.next_group(scheduler, run, 2)[0] is not None
    assert [s.session_id for s in scheduler.acquire("e", 1, 10, [], 5.0).assigned] == ["r-g7-s0", "r-g7-s1"]


def test_a_session_spans_every_version_that_sampled_one_of_its_tokens() -> None:
    """A call whose weights were swapped while it ran (policy_version_spans) counts with its newest version
    too: a group's max version (and so its staleness at delivery) must not stop at a call's first token."""
    scheduler, _ = _scheduler(tasks=1, group_size=1)
    scheduler.acquire("a", 1, 1, [], 0.0)
    result = session_result("r-g0-s0", 1, "a", versions=(3,))
    result.calls[0].completion_token_ids.extend([11, 12, 13])
    result.calls[0].policy_version_spans.add(policy_version=3, start=0, end=1)
    result.calls[0].policy_version_spans.add(policy_version=4, start=1, end=3)
    scheduler.complete(result, 1.0)
    session, group = scheduler.sessions["r-g0-s0"], scheduler.groups["r-g0"]
    assert (session.min_policy_version, session.max_policy_version) == (3, 4)
    assert (group.min_policy_version, group.max_policy_version) == (3, 4)
