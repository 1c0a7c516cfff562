"""Admission control (groups.py): how many groups a run keeps in play ahead of its trainer."""

from __future__ import annotations

from lodestar.v1 import rollout_pb2
from lodestar_rollout import groups
from lodestar_rollout.model import Run, Session
from lodestar_rollout.scheduler import Scheduler
from lodestar_rollout.spec import with_defaults
from tests.rollout.helpers import SCORED, make_spec


def _scheduler(tasks: int, group_size: int, max_staleness: int) -> tuple[Scheduler, Run]:
    scheduler = Scheduler()
    spec = make_spec(tasks=tasks, group_size=group_size, max_staleness=max_staleness)
    scheduler.add_run("r", with_defaults(spec), 0.0)
    return scheduler, scheduler.runs["r"]


def _score(scheduler: Scheduler, sessions: list[Session]) -> None:
    for session in sessions:
        result = rollout_pb2.SessionResult(
            session_id=session.session_id, attempt=session.attempt, node_id=session.node_id, outcome=SCORED
        )
        result.calls.add(session_id=session.session_id, policy_version=scheduler.policy_version)
        scheduler.complete(result, 1.0)


def _read(scheduler: Scheduler, run: Run, count: int) -> None:
    """The trainer takes `count` groups from the stream."""
    for _ in range(count):
        group, _ = groups.next_group(scheduler, run, run.groups_delivered)
        assert group is not None


def _started(run: Run, scheduler: Scheduler) -> int:
    return sum(1 for group_id in run.group_ids if scheduler.groups[group_id].started)


def test_before_the_first_report_a_run_keeps_a_bounded_lead_over_what_its_reader_took() -> None:
    scheduler, run = _scheduler(tasks=40, group_size=2, max_staleness=1)
    _score(scheduler, scheduler.acquire("a", 1, 4, [], 0.0).assigned)  # groups 0 and 1, nothing read yet
    _read(scheduler, run, 2)  # the trainer takes its first batch and trains (no version report yet)
    for _ in range(30):  # meanwhile one node with 4 slots samples as fast as it can
        _score(scheduler, scheduler.acquire("a", 1, 4, [], 1.0).assigned)
    # at most lead(1) = 1 x the 2 groups taken ahead; before: all 40 started
    assert run.groups_in_play == 2
    assert _started(run, scheduler) == 4
    _read(scheduler, run, 2)  # the trainer reads on: the lead follows what it took
    _score(scheduler, scheduler.acquire("a", 1, 4, [], 2.0).assigned)
    assert run.groups_in_play > 1


def test_nothing_is_held_back_while_nobody_reads_the_run() -> None:
    scheduler, run = _scheduler(tasks=20, group_size=2, max_staleness=1)
    for _ in range(20):  # an export or evaluation run: nobody streams it while it runs
        _score(scheduler, scheduler.acquire("a", 1, 4, [], 0.0).assigned)
    assert _started(run, scheduler) == 20


def test_a_trainers_first_report_gives_its_pace() -> None:
    scheduler, run = _scheduler(tasks=20, group_size=2, max_staleness=1)
    _score(scheduler, scheduler.acquire("a", 1, 6, [], 0.0).assigned)
    _read(scheduler, run, 3)
    scheduler.report_policy_version(1)  # version 1: the trainer's first step took those 3 groups
    assert run.batch_estimate == 3


def test_a_run_resumed_at_a_later_version_learns_its_pace_from_the_second_report() -> None:
    scheduler, run = _scheduler(tasks=20, group_size=2, max_staleness=4)
    _score(scheduler, scheduler.acquire("a", 1, 6, [], 0.0).assigned)
    _read(scheduler, run, 3)
    scheduler.report_policy_version(7)  # deliveries since the run began span unknown versions: no pace
    assert run.batch_estimate == 0
    _score(scheduler, scheduler.acquire("a", 1, 4, [], 1.0).assigned)
    _read(scheduler, run, 2)
    scheduler.report_policy_version(8)
    assert run.batch_estimate == 2


def _in_play_once_paced(max_staleness: int) -> int:
    """Groups in play for a trainer that takes 2 groups per version, with a node (2 slots, groups of 2)
    that samples as fast as it can."""
    scheduler, run = _scheduler(tasks=40, group_size=2, max_staleness=max_staleness)
    for version in (1, 2):
        _score(scheduler, scheduler.acquire("a", 1, 4, [], 0.0).assigned)
        _read(scheduler, run, 2)
        scheduler.report_policy_version(version)
    assert run.batch_estimate == 2
    assert run.groups_in_play == 0
    for _ in range(20):
        _score(scheduler, scheduler.acquire("a", 1, 2, [], 1.0).assigned)
    return run.groups_in_play


def test_a_tighter_staleness_bound_keeps_fewer_groups_in_play() -> None:
    tight, loose = _in_play_once_paced(1), _in_play_once_paced(4)
    assert tight < loose
    assert loose == 5  # LEAD_BATCHES (2.5) x 2: a bound of 4 leaves room for the whole lead
    assert tight == 2  # one batch: a group started behind more would be read 2 versions after it began
    assert groups.lead_batches(0) == 1  # a bound of 0 still lets a batch be sampled
