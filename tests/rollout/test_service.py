"""The rollout service end to end over gRPC with simulated nodes: create, acquire, complete, groups."""

from __future__ import annotations

import grpc
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import common_pb2, rollout_pb2
from tests.rollout.helpers import Rollout, call_record, make_spec, sim_node


async def test_a_run_completes_and_streams_its_groups(rollout: Rollout, etcd: EtcdClient, etcd_prefix: str) -> None:
    run_id = await rollout.create_run(make_spec(tasks=3, group_size=2))
    async with sim_node(etcd, rollout.stub, "node-a") as node:
        assigned = await node.acquire(4)
        assert [a.session_id for a in assigned] == [f"{run_id}-g{t}-s{s}" for t in (0, 1) for s in (0, 1)]
        assert all(a.attempt == 1 for a in assigned)
        assert assigned[0].task.task_id == "task-0"
        assert assigned[0].harness.kind == "command"
        assert assigned[0].sampling.mode == common_pb2.SAMPLING_MODE_RUN, "the run's (default) sampling policy"
        assert assigned[0].sampling.temperature == 1.0
        keys = await etcd.get_prefix(f"{etcd_prefix}rollout/owners/")
        assert len(keys.items) == 4
        assert {item.lease_id for item in keys.items} == {node.lease.id}
        run = await rollout.get_run(run_id)
        assert (run.sessions_total, run.sessions_pending, run.sessions_running) == (6, 2, 4)
        for index, assignment in enumerate(assigned):
            assert await node.complete(
                assignment, reward=float(index % 2), calls=[call_record(assignment.session_id, policy_version=3)]
            )
        assigned = await node.acquire(4)
        assert len(assigned) == 2
        for assignment in assigned:
            assert await node.complete(assignment, reward=1.0)
    run = await rollout.get_run(run_id)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert (run.sessions_succeeded, run.groups_complete, run.sessions_running) == (6, 3, 0)
    assert run.reward_mean == pytest.approx(4 / 6)
    groups = await rollout.groups(run_id)
    assert [g.task_id for g in groups] == ["task-0", "task-1", "task-2"]
    assert groups[0].min_policy_version == 3
    assert groups[2].max_policy_version == 0
    assert [len(g.sessions) for g in groups] == [2, 2, 2]
    assert groups[0].sessions[0].calls[0].original_request_json == "{}"
    assert (await rollout.get_run(run_id)).groups_delivered == 3
    keys = await etcd.get_prefix(f"{etcd_prefix}rollout/owners/")
    assert keys.items == []


async def test_unknown_run_is_not_found(rollout: Rollout) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rollout.get_run("run-nope")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_unknown_run_in_every_run_rpc_is_not_found(rollout: Rollout) -> None:
    calls = [
        rollout.stub.CancelRun(rollout_pb2.CancelRunRequest(run_id="run-nope")),
        rollout.groups("run-nope"),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    result = rollout_pb2.SessionResult(session_id="nope", attempt=1, node_id="a", outcome=1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rollout.stub.CompleteSession(rollout_pb2.CompleteSessionRequest(result=result))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
