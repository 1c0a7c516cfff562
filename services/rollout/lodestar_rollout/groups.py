"""Groups: when one completes, the order in which complete groups reach the trainer, and how far
rollout may run ahead of it.

A group (one task, `group_size` sessions) completes as soon as `required` = ceil(early_stop_fraction x
group_size) of its sessions are scored; its other live sessions are cancelled (their nodes are told on
their next poll). A group whose sessions can no longer reach `required` (some failed after max_attempts)
completes when none is live any more, with the sessions that scored — or FAILS, delivering nothing, when
none scored.

Complete groups get a completion sequence number in their run. The stream walks them in that order and
fixes each group's fate only when it is about to be sent (a reader that does not keep up holds back the
decision): too stale (latest reported policy version - the group's oldest call's version >
max_staleness) -> dropped, counted and logged, its task is NOT re-sampled (a trainer that outruns rollout
would otherwise never finish the run); else it takes the next delivery sequence number.
`StreamGroups(start_after=k)` sends the groups with delivery sequence > k, so a consumer that reconnects
with the number it already received loses and repeats nothing.

Admission control: a run starts no new group while `in_play_limit` of its groups are in play (started,
not yet delivered or dropped); sessions of started groups are always handed out. The limit is a lead of
`lead_batches(max_staleness)` trainer batches: LEAD_BATCHES, but at most max_staleness (a group started
behind L batches is read about L versions later). The batch is `batch_estimate`, the groups the trainer
takes per policy version (with or without signal), learned from deliveries between version reports (from
the first report on, for a trainer that starts at version 0); before that, once a reader took a group,
what it took so far (its first batch, being read). While nobody has read a group (evaluation or export
runs, or a trainer still waiting for its first group) nothing is held back. See docs/benchmarks.md
(Rollout) for why: without it rollout races ahead and its groups go stale.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_rollout.model import LIVE, Changes, Group, GroupStatus, Run, Session, SessionStatus

LEAD_BATCHES = 2.5
"""The most trainer batches' worth of groups a run keeps in play (chosen with bench/rollout_sim.py at
max_staleness 4: 2.0 left the trainer 4% idle, 3.0 dropped 2.6x more stale groups than 2.5)."""
_log = get_logger("rollout.groups")


class Scheduler(Protocol):
    """What these functions need of `scheduler.Scheduler`, the state they act on (a Protocol, so that this
    module does not import the scheduler that calls it)."""

    runs: dict[str, Run]
    groups: dict[str, Group]
    sessions: dict[str, Session]
    policy_version: int

    def cancel_session(self, session: Session, changes: Changes) -> None: ...


def settle(scheduler: Scheduler, group_id: str) -> Changes:
    """Complete (or fail) the group if its sessions decide it; cancel the rest; end the run when done."""
    group = scheduler.groups[group_id]
    if group.status is not GroupStatus.OPEN:
        return Changes()
    sessions = [scheduler.sessions[session_id] for session_id in group.session_ids]
    scored = [session for session in sessions if session.status is SessionStatus.SCORED]
    live = [session for session in sessions if session.status in LIVE]
    if len(scored) < group.required and live:
        return Changes()
    run = scheduler.runs[group.run_id]
    changes = Changes(runs={run.run_id}, groups={group_id}, group_events={run.run_id})
    if scored:
        group.status = GroupStatus.COMPLETE
        run.groups_completed += 1
        group.completion_seq = run.groups_completed
        run.completion_order.append(group_id)
        group.min_policy_version = min(session.min_policy_version for session in scored)
        group.max_policy_version = max(session.max_policy_version for session in scored)
    else:
        group.status = GroupStatus.FAILED
        _leave_play(run, group)
        _log.warning("group failed: no session scored", run=run.run_id, group=group_id)
    for session in live:
        scheduler.cancel_session(session, changes)
    if all(scheduler.groups[gid].status is not GroupStatus.OPEN for gid in run.group_ids):
        run.state = rollout_pb2.RUN_STATE_COMPLETED
        _log.info("run completed", run=run.run_id, groups=run.groups_completed)
    return changes


def cancel_open(scheduler: Scheduler, run: Run) -> Changes:
    """Cancel every open group of a (cancelled) run and its live sessions."""
    changes = Changes(runs={run.run_id}, group_events={run.run_id})
    for group_id in run.group_ids:
        group = scheduler.groups[group_id]
        if group.status is not GroupStatus.OPEN:
            continue
        group.status = GroupStatus.CANCELLED
        _leave_play(run, group)
        changes.groups.add(group_id)
        for session_id in group.session_ids:
            session = scheduler.sessions[session_id]
            if session.status in LIVE:
                scheduler.cancel_session(session, changes)
    return changes


def _leave_play(run: Run, group: Group) -> None:
    if group.started:
        run.groups_in_play -= 1


def is_stale(group: Group, run: Run, policy_version: int) -> bool:
    return policy_version - group.min_policy_version > run.spec.max_staleness


def next_group(scheduler: Scheduler, run: Run, start_after: int) -> tuple[Group | None, Changes]:
    """The group with delivery sequence `start_after + 1`, deciding the fate of the next undecided complete
    groups (in completion order) to find it; None when none is waiting yet. Groups delivered already
    (`start_after < run.groups_delivered`) have left memory: the caller reads them from the store."""
    changes = Changes()
    while run.completion_order and run.groups_delivered <= start_after:
        group = scheduler.groups[run.completion_order.popleft()]
        _leave_play(run, group)
        changes.runs.add(run.run_id)
        changes.groups.add(group.group_id)
        if is_stale(group, run, scheduler.policy_version):
            group.dropped = True
            run.groups_dropped += 1
            _log.warning(
                "group dropped as stale",
                run=run.run_id,
                group=group.group_id,
                min_policy_version=group.min_policy_version,
                policy_version=scheduler.policy_version,
                max_staleness=run.spec.max_staleness,
            )
            continue
        run.groups_delivered += 1
        group.delivery_seq = run.groups_delivered
        if group.delivery_seq == start_after + 1:
            return group, changes
    return None, changes


def restore_delivery(scheduler: Scheduler, run: Run) -> None:
    """Rebuild a loaded run's derived stream and admission state from its live groups."""
    groups = [scheduler.groups[gid] for gid in run.group_ids]
    undecided = [g for g in groups if g.status is GroupStatus.COMPLETE and not g.done]
    run.completion_order = deque(g.group_id for g in sorted(undecided, key=lambda g: g.completion_seq))
    for group in groups:
        group.started = any(scheduler.sessions[sid].attempt > 0 for sid in group.session_ids)
    run.groups_in_play = sum(1 for g in groups if g.started and not g.done)


def observe_policy_version(run: Run, version: int) -> bool:
    """Learn the trainer's pace: groups delivered per policy version since the last report (True: the run's
    estimate or mark changed; both are stored, so the pace survives a restart). Version 1 as the first
    report is a trainer's first step: what the run delivered before it is that step's batch."""
    last_version, last_delivered = run.version_mark
    if version <= last_version:
        return False
    taken = run.groups_delivered - last_delivered
    if (last_version > 0 or version == 1) and taken > 0:
        pace = taken / (version - last_version)
        run.batch_estimate = pace if run.batch_estimate <= 0 else 0.5 * run.batch_estimate + 0.5 * pace
    run.version_mark = (version, run.groups_delivered)
    return True


def lead_batches(max_staleness: int) -> float:
    """Trainer batches' worth of groups a run keeps in play: LEAD_BATCHES, but at most max_staleness (and
    at least one batch). A group started behind L batches in play is read about L policy versions later,
    and dropped if that is more than max_staleness."""
    return max(1.0, min(LEAD_BATCHES, float(max_staleness)))


def in_play_limit(run: Run) -> float:
    """How many groups of `run` may be in play (started, not yet delivered or dropped); inf: no limit.

    `lead_batches` x the trainer's batch: its estimated pace, or before that what a reader took so far (its
    first batch, being read)."""
    if run.batch_estimate > 0:
        batch = run.batch_estimate
    elif run.groups_delivered > 0:
        batch = float(run.groups_delivered)
    else:
        return math.inf  # nobody reads the run (yet): maybe nobody trains on it
    return lead_batches(run.spec.max_staleness) * batch


def admits_new_group(run: Run) -> bool:
    """Whether `run` may start a new group now (see `in_play_limit`)."""
    return run.groups_in_play < in_play_limit(run)


def scored_session_ids(scheduler: Scheduler, group: Group) -> list[str]:
    """The sessions a complete group delivers (scored, in sample order)."""
    return [sid for sid in group.session_ids if scheduler.sessions[sid].status is SessionStatus.SCORED]
