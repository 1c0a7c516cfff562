"""StreamGroups on the real service: completion order, waiting for new groups, resuming with
start_after, staleness drops against ReportPolicyVersion, tokens_only, and a 20 MB session."""

from __future__ import annotations

import asyncio

from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from tests.rollout.helpers import Rollout, SimNode, call_record, make_spec, sim_node


async def _finish(
    node: SimNode, order: list[int], assigned: list[rollout_pb2.SessionAssignment], version: int = 0
) -> None:
    for index in order:
        calls = [call_record(assigned[index].session_id, policy_version=version)]
        assert await node.complete(assigned[index], calls=calls)


async def test_the_stream_waits_for_groups_in_completion_order_and_resumes(rollout: Rollout, etcd: EtcdClient) -> None:
    run_id = await rollout.create_run(make_spec(tasks=3, group_size=1))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(3)
        reader = asyncio.create_task(rollout.groups(run_id))
        await _finish(node, [2], assigned)
        await asyncio.sleep(0.3)
        assert not reader.done()  # it waits: the run is not over
        await _finish(node, [0, 1], assigned)
        streamed = await asyncio.wait_for(reader, 10)
    assert [g.task_id for g in streamed] == ["task-2", "task-0", "task-1"]
    resumed = await rollout.groups(run_id, start_after=2)
    assert [g.task_id for g in resumed] == ["task-1"]  # a consumer that got 2 gets only the third
    assert await rollout.groups(run_id, start_after=3) == []
    assert (await rollout.get_run(run_id)).groups_delivered == 3


async def test_a_consumer_that_disconnects_mid_run_loses_and_repeats_nothing(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=4, group_size=1))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(4)
        await _finish(node, [0, 1], assigned)
        first = await rollout.groups(run_id, limit=1)  # takes one, then the connection drops
        await _finish(node, [2, 3], assigned)
        rest = await rollout.groups(run_id, start_after=len(first))
    assert [g.task_id for g in first + rest] == ["task-0", "task-1", "task-2", "task-3"]


async def test_stale_groups_are_dropped_and_counted(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=3, group_size=1, max_staleness=1))
    await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=4))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(3)
        await _finish(node, [0], assigned, version=4)
        await _finish(node, [1], assigned, version=2)  # 2 versions behind: too stale
        await _finish(node, [2], assigned, version=3)
    streamed = await rollout.groups(run_id)
    assert [(g.task_id, g.min_policy_version) for g in streamed] == [("task-0", 4), ("task-2", 3)]
    run = await rollout.get_run(run_id)
    assert (run.groups_complete, run.groups_delivered, run.groups_dropped, run.policy_version) == (3, 2, 1, 4)


async def test_max_groups_ends_the_stream_and_staleness_is_decided_when_a_group_is_asked_for(
    rollout: Rollout, etcd
) -> None:
    run_id = await rollout.create_run(make_spec(tasks=3, group_size=1, max_staleness=1))
    await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=1))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(3)
        await _finish(node, [0, 1, 2], assigned, version=1)  # all three complete, fresh at version 1
        first = await rollout.groups(run_id, max_groups=1)  # the stream ends by itself after one group
        assert [g.task_id for g in first] == ["task-0"]
        # the trainer steps twice before asking again: task-1 and task-2 are now 2 versions behind
        await rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=3))
        assert await rollout.groups(run_id, start_after=1, max_groups=1) == []  # both dropped, run over
    run = await rollout.get_run(run_id)
    assert (run.groups_delivered, run.groups_dropped) == (1, 2)


async def test_tokens_only_strips_bodies_and_chat(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=1))
    async with sim_node(etcd, rollout.stub, "a") as node:
        (assignment,) = await node.acquire(1)
        await node.complete(assignment, calls=[call_record(assignment.session_id, body='{"big": true}')])
    (full,) = await rollout.groups(run_id)
    (lean,) = await rollout.groups(run_id, tokens_only=True)
    assert full.sessions[0].calls[0].original_request_json == '{"big": true}'
    assert len(full.sessions[0].calls[0].messages) == 1
    call = lean.sessions[0].calls[0]
    assert (call.original_request_json, len(call.messages), len(call.tools)) == ("", 0, 0)
    assert (list(call.prompt_token_ids), list(call.completion_logprobs)) == ([1, 2, 3], [-0.5, -0.25])


async def test_a_200_call_session_of_100_kb_bodies_round_trips(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=1))
    body = '{"messages": "' + "x" * 100_000 + '"}'
    async with sim_node(etcd, rollout.stub, "a") as node:
        (assignment,) = await node.acquire(1)
        calls = [call_record(assignment.session_id, sequence=n, body=body) for n in range(200)]
        size = rollout_pb2.SessionResult(calls=calls).ByteSize()
        assert size > 20_000_000
        assert await node.complete(assignment, calls=calls)
    (group,) = await rollout.groups(run_id)
    assert len(group.sessions[0].calls) == 200
    assert group.sessions[0].calls[199].original_request_json == body


async def test_policy_version_reports_hold_back_new_groups_while_the_trainer_is_behind(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=10, group_size=1))
    report = rollout.stub.ReportPolicyVersion
    await report(rollout_pb2.ReportPolicyVersionRequest(policy_version=1))
    async with sim_node(etcd, rollout.stub, "a") as node:
        first = await node.acquire(2)
        await _finish(node, [0, 1], first, version=1)
        assert len(await rollout.groups(run_id, limit=2)) == 2  # the trainer takes 2 groups...
        await report(rollout_pb2.ReportPolicyVersionRequest(policy_version=2))  # ...per policy version
        held_back = await node.acquire(10)
        assert len(held_back) == 5  # 2.5 batches of 2 groups in play, the other 3 tasks wait
        await _finish(node, [0], held_back, version=2)
        assert await node.acquire(10) == []  # complete but not yet delivered: still in play
        assert len(await rollout.groups(run_id, start_after=2, limit=1)) == 1
        assert len(await node.acquire(10)) == 1
