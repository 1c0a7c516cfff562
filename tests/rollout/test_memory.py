"""Memory bounded by work in flight, on a real rollout server (real etcd, SQLite and PostgreSQL stores):
done groups and their sessions leave memory, every read RPC answers the same from the store as it did
from memory, a repeated result for a forgotten session gets its first answer, a restarted service loads
only live groups, and the trainer-pace estimate survives the restart."""

from __future__ import annotations

from typing import Any

import grpc.aio
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from lodestar_rollout.scheduler import Scheduler
from tests.rollout.helpers import (
    INFRA_FAILED,
    Rollout,
    SimNode,
    call_record,
    make_spec,
    settings,
    sim_node,
    start_rollout,
)


async def _answers(rollout: Rollout, run_ids: list[str]) -> dict[str, Any]:
    """Every read RPC's answer about `run_ids` (the policy version and dashboards' views included)."""
    stub = rollout.stub
    out: dict[str, Any] = {}
    for run_id in run_ids:  # the stream first: it decides the groups' fates, which the views show
        out[f"{run_id}/stream"] = await rollout.groups(run_id)
        out[run_id] = await rollout.get_run(run_id)
        groups = (await stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id))).groups
        out[f"{run_id}/groups"] = groups
        out[f"{run_id}/failed"] = await stub.ListFailedAttempts(rollout_pb2.ListFailedAttemptsRequest(run_id=run_id))
        for group in groups:
            for session in group.sessions:
                request = rollout_pb2.GetSessionDetailRequest(session_id=session.session_id)
                out[session.session_id] = await stub.GetSessionDetail(request)
    out["runs"] = (await stub.ListRuns(rollout_pb2.ListRunsRequest())).runs
    return out


async def _finish(node: SimNode, *, fail_first: bool = False) -> None:
    """Run every session handed out until nothing is left (the first one fails once if asked)."""
    while assigned := await node.acquire(8):
        for assignment in assigned:
            if fail_first:
                fail_first = False
                await node.complete(assignment, INFRA_FAILED, 0.0, calls=[], error="boom")
                continue
            calls = [call_record(assignment.session_id, sequence) for sequence in range(3)]
            await node.complete(
                assignment, reward=0.25 * (assignment.attempt + len(assignment.session_id) % 3), calls=calls
            )


def _held(scheduler: Scheduler, run_ids: list[str]) -> tuple[int, int]:
    """(groups, sessions) of `run_ids` the scheduler holds in memory."""
    groups = sum(1 for group in scheduler.groups.values() if group.run_id in run_ids)
    sessions = sum(1 for session in scheduler.sessions.values() if session.run_id in run_ids)
    return groups, sessions


async def test_finished_work_leaves_memory_and_reads_answer_the_same(
    store_location: str, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = settings(store_location, etcd_endpoint, etcd_prefix)
    async with start_rollout(config) as rollout, sim_node(etcd, rollout.stub, "n", ttl=30) as node:
        forget = rollout.core.scheduler.forget_done
        monkeypatch.setattr(rollout.core.scheduler, "forget_done", lambda group_ids: None)  # all stays in memory
        finished = [await rollout.create_run(make_spec(tasks=3, group_size=2)) for _ in range(5)]
        await _finish(node, fail_first=True)
        cancelled = await rollout.create_run(make_spec(tasks=2, group_size=2))
        (first,) = await node.acquire(1)
        await node.complete(first)
        await rollout.stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=cancelled))
        finished.append(cancelled)
        await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=3))
        from_memory = await _answers(rollout, finished)  # streams every group: all of them are done now
        scheduler = rollout.core.scheduler
        assert _held(scheduler, finished) == (17, 34)
        assert all(from_memory[run_id].state != rollout_pb2.RUN_STATE_RUNNING for run_id in finished)
        assert from_memory[finished[0]].infra_failures == 1

        forget(list(scheduler.groups))
        assert _held(scheduler, finished) == (0, 0)
        assert scheduler.runs.keys() >= set(finished)  # finished runs stay as summaries
        assert await _answers(rollout, finished) == from_memory  # the same answers, now from the store

        done = finished[1]
        session_id = from_memory[f"{done}/groups"][0].sessions[0].session_id
        repeated = rollout_pb2.SessionResult(session_id=session_id, attempt=1, node_id="n", outcome=1, reward=9.0)
        assert (await rollout.stub.CompleteSession(rollout_pb2.CompleteSessionRequest(result=repeated))).counted
        stale = rollout_pb2.SessionResult(session_id=session_id, attempt=7, node_id="n", outcome=1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rollout.stub.CompleteSession(rollout_pb2.CompleteSessionRequest(result=stale))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await rollout.get_run(done)) == from_memory[done]  # nothing counted twice

    async with start_rollout(config) as restarted:
        assert _held(restarted.core.scheduler, finished) == (0, 0)  # finished runs load as summaries only
        assert await _answers(restarted, finished) == from_memory


async def test_done_groups_of_a_running_run_leave_memory_and_live_work_survives_a_restart(
    store_location: str, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient
) -> None:
    config = settings(store_location, etcd_endpoint, etcd_prefix)
    async with sim_node(etcd, None, "n", ttl=30) as node:  # type: ignore[arg-type]
        async with start_rollout(config) as rollout:
            node.stub = rollout.stub
            run_id = await rollout.create_run(make_spec(tasks=6, group_size=2))
            await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=1))
            assigned = await node.acquire(6)  # groups 0-2
            for assignment in assigned[:4]:  # groups 0 and 1 complete
                await node.complete(assignment)
            sent = await rollout.groups(run_id, max_groups=2)
            assert [group.group_id for group in sent] == [f"{run_id}-g0", f"{run_id}-g1"]
            await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=2))
            scheduler = rollout.core.scheduler
            run = scheduler.runs[run_id]
            assert (run.batch_estimate, run.version_mark) == (2.0, (2, 2))  # 2 groups taken in one version
            assert list(run.group_ids) == [f"{run_id}-g{task}" for task in range(2, 6)]  # delivered: left memory
            assert _held(scheduler, [run_id]) == (4, 8)
            view = await rollout.get_run(run_id)
            counts = (view.sessions_total, view.sessions_succeeded, view.sessions_running, view.sessions_pending)
            assert counts == (12, 4, 2, 6)
            assert await rollout.groups(run_id, max_groups=2) == sent  # a resumed stream reads them from the store
            groups_before = (await rollout.stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id))).groups

        async with start_rollout(config) as restarted:
            scheduler = restarted.core.scheduler
            run = scheduler.runs[run_id]
            assert (run.batch_estimate, run.version_mark) == (2.0, (2, 2))  # the trainer's pace survives
            assert run.groups_in_play == 1  # group 2 was started
            assert _held(scheduler, [run_id]) == (4, 8)  # only live groups were loaded
            assert await restarted.get_run(run_id) == view
            listed = (await restarted.stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id))).groups
            assert listed == groups_before
            assert await restarted.groups(run_id, max_groups=2) == sent
