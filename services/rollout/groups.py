"""Groups: when one completes, and the order in which complete groups are streamed to the trainer.

A group (one task, `group_size` sessions) completes as soon as `required` = ceil(early_stop_fraction x
group_size) of its sessions are scored; its other live sessions are cancelled (their nodes are told on
their next poll). A group whose sessions can no longer reach `required` (some failed after max_attempts)
completes when none is live any more, with the sessions that scored — or FAILS, delivering nothing, when
none scored.

Complete groups get a completion sequence number in their run. The stream walks them in that order and
fixes, once, each group's fate: too stale (latest reported policy version - the group's oldest call's
version > max_staleness) -> dropped, counted and logged, its task is NOT re-sampled (a trainer that
outruns rollout would otherwise never finish the run); else it gets the next delivery sequence number.
`StreamGroups(start_after=k)` sends the groups with delivery sequence > k, so a consumer that
reconnects with the number it already received loses and repeats nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from services.rollout.model import LIVE, Changes, Group, GroupStatus, Run, SessionStatus

if TYPE_CHECKING:
    from services.rollout.scheduler import Scheduler

_log = get_logger("rollout.groups")


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
        group.min_policy_version = min(session.min_policy_version for session in scored)
        group.max_policy_version = max(session.max_policy_version for session in scored)
    else:
        group.status = GroupStatus.FAILED
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
        changes.groups.add(group_id)
        for session_id in group.session_ids:
            session = scheduler.sessions[session_id]
            if session.status in LIVE:
                scheduler.cancel_session(session, changes)
    return changes


def is_stale(group: Group, run: Run, policy_version: int) -> bool:
    return policy_version - group.min_policy_version > run.spec.max_staleness


def deliverable(scheduler: Scheduler, run: Run, start_after: int) -> tuple[list[Group], Changes]:
    """The complete groups to send after delivery sequence `start_after`, in order, deciding (once) the
    fate of groups not decided yet."""
    changes = Changes()
    complete = sorted(
        (g for gid in run.group_ids if (g := scheduler.groups[gid]).completion_seq > 0),
        key=lambda g: g.completion_seq,
    )
    out = []
    for group in complete:
        if group.dropped:
            continue
        if group.delivery_seq == 0:
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
        if group.delivery_seq > start_after:
            out.append(group)
    return out, changes


def scored_session_ids(scheduler: Scheduler, group: Group) -> list[str]:
    """The sessions a complete group delivers (scored, in sample order)."""
    return [sid for sid in group.session_ids if scheduler.sessions[sid].status is SessionStatus.SCORED]
