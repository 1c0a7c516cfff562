"""The read-only RPCs for dashboards (ListRuns, ListGroups, GetSessionDetail, ListFailedAttempts) on a real
rollout server, and the store queries behind them on SQLite and PostgreSQL."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from lodestar_rollout.model import AttemptRecord, StoredResult
from lodestar_rollout.store import Rows
from lodestar_rollout.stores import open_store
from tests.rollout.helpers import INFRA_FAILED, Rollout, call_record, make_spec, sim_node


async def test_browse_a_run(rollout: Rollout, etcd: EtcdClient) -> None:
    older = await rollout.create_run(make_spec(tasks=1, group_size=1))
    run_id = await rollout.create_run(make_spec(tasks=2, group_size=2))
    runs = (await rollout.stub.ListRuns(rollout_pb2.ListRunsRequest())).runs
    assert [run.run_id for run in runs][:2] == [run_id, older]  # newest first
    assert len((await rollout.stub.ListRuns(rollout_pb2.ListRunsRequest(limit=1))).runs) == 1
    await rollout.stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=older))

    async with sim_node(etcd, rollout.stub, "node-b", ttl=30) as node:
        assigned = await node.acquire(4)
        assert len(assigned) == 4
        first, second = assigned[0], assigned[1]
        calls = [call_record(first.session_id, sequence) for sequence in range(5)]
        await node.complete(first, reward=0.5, calls=calls, stdout_tail="out")
        await node.complete(second, INFRA_FAILED, 0.0, calls=[], error="runtime exploded")

        groups = (await rollout.stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id))).groups
        assert [group.task_id for group in groups] == ["task-0", "task-1"]
        summaries = {s.session_id: s for group in groups for s in group.sessions}
        assert summaries[first.session_id].status == rollout_pb2.SESSION_STATUS_SCORED
        assert summaries[first.session_id].reward == 0.5
        assert summaries[first.session_id].run_id == run_id
        assert summaries[second.session_id].status == rollout_pb2.SESSION_STATUS_PENDING  # requeued
        assert summaries[second.session_id].failures == 1

        request = rollout_pb2.GetSessionDetailRequest(
            session_id=first.session_id, call_offset=1, call_limit=2, calls_without_bodies=True
        )
        detail = await rollout.stub.GetSessionDetail(request)
        assert detail.call_count == 5
        assert [call.sequence for call in detail.result.calls] == [1, 2]
        assert not detail.result.calls[0].original_request_json
        assert not detail.result.calls[0].messages
        assert list(detail.result.calls[0].completion_logprobs) == [-0.5, -0.25]
        assert detail.result.stdout_tail == "out"
        assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "scored")]
        whole = await rollout.stub.GetSessionDetail(rollout_pb2.GetSessionDetailRequest(session_id=first.session_id))
        assert len(whole.result.calls) == 5
        assert whole.result.calls[0].messages

        failed = await rollout.stub.GetSessionDetail(rollout_pb2.GetSessionDetailRequest(session_id=second.session_id))
        assert failed.result.error == "runtime exploded"  # no counted result: the latest attempt's report
        attempts = await rollout.stub.ListFailedAttempts(rollout_pb2.ListFailedAttemptsRequest(run_id=run_id))
        assert [(a.session_id, a.outcome, a.error) for a in attempts.attempts] == [
            (second.session_id, "infra_failed", "runtime exploded")
        ]


@pytest.mark.parametrize(
    "call",
    [
        lambda stub: stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id="run-nope")),
        lambda stub: stub.GetSessionDetail(rollout_pb2.GetSessionDetailRequest(session_id="nope")),
        lambda stub: stub.ListFailedAttempts(rollout_pb2.ListFailedAttemptsRequest(run_id="run-nope")),
    ],
)
async def test_unknown_ids_are_not_found(rollout: Rollout, call) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(rollout.stub)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def _result(session_id: str, attempt: int, reward: float) -> rollout_pb2.SessionResult:
    return rollout_pb2.SessionResult(session_id=session_id, attempt=attempt, node_id="n", reward=reward)


@pytest.mark.slow
def test_store_shown_result_and_failed_attempts(store_location: str) -> None:
    store = open_store(store_location)
    try:
        spec = make_spec(tasks=1, group_size=1)
        rows = Rows(specs=[("run-1", spec)])
        rows.runs.append(("run-1", 1, 0.0, 1, 0, 0, 0, 0, '{"sums": {}, "counts": {}}', 0.0, 0.0, 0, 0))
        rows.sessions.append(("s1", "run-1", "g1", 0, 0, "scored", 3, 1, "n", 1, 0, 1, 1.0, 1, 0, 0, 0.0))
        rows.attempts = [
            AttemptRecord("s1", 1, "n", 1, 1.0, 2.0, "infra_failed", "boom"),
            AttemptRecord("s1", 2, "n", 1, 3.0, 4.0, "lost", "lease ended"),
            AttemptRecord("s1", 3, "n", 1, 5.0, 6.0, "scored"),
        ]
        rows.results = [
            StoredResult(_result("s1", 1, 0.0), False),
            StoredResult(_result("s1", 3, 1.0), True),
            StoredResult(_result("s1", 4, 0.0), False),  # a later report that did not count
        ]
        store.write([rows])
        shown = store.shown_result("s1")
        assert shown is not None
        assert shown.counted
        assert shown.result.attempt == 3
        assert store.shown_result("unknown") is None
        assert [(a.attempt, a.outcome) for a in store.failed_attempts("run-1", 0)] == [(2, "lost"), (1, "infra_failed")]
        assert len(store.failed_attempts("run-1", 1)) == 1
        assert store.failed_attempts("run-2", 0) == []
    finally:
        store.close()
