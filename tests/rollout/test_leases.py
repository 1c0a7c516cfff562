"""Nodes and leases on the real stack: fencing of superseded attempts, a node whose lease ends has its
sessions requeued as new attempts within the TTL (nothing counted twice, checked in the store), an
unknown lease cannot acquire, early stop and cancelled runs reach the node through its next poll."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import grpc
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from tests.rollout.helpers import INFRA_FAILED, Rollout, make_spec, sim_node
from tests.waiting import eventually

TTL_S = 2


async def _wait_requeued(rollout: Rollout, run_id: str, pending: int, within: float) -> float:
    """Seconds until the run has `pending` sessions pending (the lost ones requeued); fails after `within`."""

    async def pending_now() -> int:
        return (await rollout.get_run(run_id)).sessions_pending

    started = time.monotonic()
    await eventually(
        pending_now, within, what=f"{pending} sessions pending (requeued)", until=lambda now: now == pending
    )
    return time.monotonic() - started


def _store_rows(path: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchall()


@pytest.mark.parametrize("how", ["revoked", "expired"])
@pytest.mark.slow
async def test_a_lost_node_lease_requeues_its_sessions_as_new_attempts(
    rollout: Rollout, etcd: EtcdClient, tmp_path: Path, how: str
) -> None:
    run_id = await rollout.create_run(make_spec(tasks=2, group_size=2))
    async with sim_node(etcd, rollout.stub, "doomed", ttl=TTL_S) as doomed, sim_node(etcd, rollout.stub, "b") as b:
        lost = await doomed.acquire(3)
        (kept,) = await b.acquire(1)
        if how == "revoked":
            await doomed.lease.revoke()
        else:
            await doomed.lease.stop_keepalive()  # the process froze or died: etcd expires the lease
        took = await _wait_requeued(rollout, run_id, pending=3, within=TTL_S + 3)
        assert took < (1.0 if how == "revoked" else TTL_S + 2)
        for assignment in lost:  # the dead attempts' late results are refused
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await doomed.complete(assignment)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        retried = await b.acquire(3)
        assert sorted((a.session_id, a.attempt) for a in retried) == sorted((a.session_id, 2) for a in lost)
        for assignment in [kept, *retried]:
            assert await b.complete(assignment)
    run = await rollout.get_run(run_id)
    assert (run.state, run.sessions_succeeded, run.groups_complete) == (rollout_pb2.RUN_STATE_COMPLETED, 4, 2)
    store = tmp_path / "rollout.sqlite"
    counted = _store_rows(store, "SELECT session_id, COUNT(*) FROM results WHERE counted = 1 GROUP BY session_id")
    assert sorted(n for _, n in counted) == [1, 1, 1, 1]  # every session counted exactly once
    attempts = _store_rows(store, "SELECT session_id, attempt, node_id, outcome FROM attempts ORDER BY 1, 2")
    assert [(a, node, outcome) for _, a, node, outcome in attempts if node == "doomed"] == [(1, "doomed", "lost")] * 3
    assert _store_rows(store, "SELECT COUNT(*) FROM results WHERE node_id = 'doomed'") == [(0,)]


async def test_acquire_with_an_unknown_lease_is_refused_and_hands_nothing_out(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=2))
    request = rollout_pb2.AcquireSessionsRequest(node_id="ghost", lease_id=0x1234567, free_slots=2)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rollout.stub.AcquireSessions(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "register" in (caught.value.details() or "")
    run = await rollout.get_run(run_id)
    assert (run.sessions_pending, run.sessions_running) == (2, 0)
    async with sim_node(etcd, rollout.stub, "real") as node:
        assert [a.attempt for a in await node.acquire(2)] == [1, 1]  # the refused hand-out left no trace


async def test_early_stop_cancels_the_rest_through_the_nodes_next_poll(rollout: Rollout, etcd, etcd_prefix) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=4, early_stop_fraction=0.5))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(4)
        node.stages[assigned[3].session_id] = rollout_pb2.SESSION_STAGE_READY
        await node.acquire(0)
        run = await rollout.get_run(run_id)
        assert (run.sessions_running, run.sessions_ready) == (4, 1)
        assert await node.complete(assigned[0])
        assert await node.complete(assigned[1], rollout_pb2.SESSION_OUTCOME_TIMED_OUT, reward=0.0)
        await node.acquire(0)
        assert sorted(node.cancelled) == sorted((a.session_id, 1) for a in assigned[2:])
        assert not await node.complete(assigned[2])  # a late result is recorded but not counted
    run = await rollout.get_run(run_id)
    assert (run.sessions_succeeded, run.sessions_cancelled, run.sessions_timed_out) == (2, 2, 1)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert (await etcd.get_prefix(f"{etcd_prefix}rollout/owners/")).items == []
    (group,) = await rollout.groups(run_id)
    assert [s.session_id for s in group.sessions] == [a.session_id for a in assigned[:2]]


async def test_infra_failures_are_retried_then_given_up(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=2, max_attempts=2))
    async with sim_node(etcd, rollout.stub, "a") as node:
        first = await node.acquire(2)
        assert await node.complete(first[0], reward=0.25)
        assert not await node.complete(first[1], INFRA_FAILED, error="verifier crashed")
        (retry,) = await node.acquire(2)
        assert (retry.session_id, retry.attempt) == (first[1].session_id, 2)
        assert not await node.complete(retry, INFRA_FAILED, error="verifier crashed again")
        assert await node.acquire(2) == []
    run = await rollout.get_run(run_id)
    assert (run.sessions_succeeded, run.sessions_failed, run.infra_failures) == (1, 1, 2)
    assert run.reward_mean == pytest.approx(0.25)  # a failure is never a reward
    (group,) = await rollout.groups(run_id)
    assert [s.reward for s in group.sessions] == [0.25]


async def test_cancel_run_cancels_everything(rollout: Rollout, etcd) -> None:
    run_id = await rollout.create_run(make_spec(tasks=3, group_size=2))
    async with sim_node(etcd, rollout.stub, "a") as node:
        assigned = await node.acquire(3)
        assert await node.complete(assigned[0])
        assert await node.complete(assigned[1])  # group 0 completes: it stays deliverable
        reply = await rollout.stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id))
        assert reply.run.state == rollout_pb2.RUN_STATE_CANCELLED
        assert reply.run.sessions_cancelled == 4
        await node.acquire(2)
        assert node.cancelled == [(assigned[2].session_id, 1)]
        assert node.held == {}
    assert [g.group_id for g in await rollout.groups(run_id)] == [f"{run_id}-g0"]
