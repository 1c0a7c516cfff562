"""Durability and etcd outages: a restarted service resumes a run from its store (reconciling with
etcd), and a service whose etcd stops and restarts keeps serving what does not need etcd, reconnects,
and the run completes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from tests.conftest import EtcdServer
from tests.etcd_support import restart_etcd
from tests.rollout.helpers import make_spec, settings, sim_node, start_rollout
from tests.waiting import eventually


async def test_a_restarted_service_resumes_the_run_from_its_store(
    store_location: str, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient
) -> None:
    """On SQLite and on PostgreSQL (`store_location`)."""
    config = settings(store_location, etcd_endpoint, etcd_prefix)
    async with sim_node(etcd, None, "a", ttl=5) as node, sim_node(etcd, None, "dies", ttl=5) as dies:  # type: ignore[arg-type]
        async with start_rollout(config) as first:
            node.stub = dies.stub = first.stub
            run_id = await first.create_run(make_spec(tasks=3, group_size=2))
            assigned = await node.acquire(3)
            (lost,) = await dies.acquire(1)
            for assignment in assigned[:2]:
                assert await node.complete(assignment)
            assert [g.task_id for g in await first.groups(run_id, limit=1)] == ["task-0"]
        await dies.lease.revoke()  # a node dies while no rollout runs: nobody watches its keys
        async with start_rollout(config) as second:
            node.stub = second.stub
            run = await eventually(  # the first reconciliation with etcd runs right after leading
                lambda: second.get_run(run_id), 10, what="one session running", until=lambda r: r.sessions_running == 1
            )
            assert (run.sessions_succeeded, run.sessions_running, run.groups_complete) == (2, 1, 1)
            assert run.sessions_pending == 3  # the dead node's session was requeued by reconciliation
            assert await node.complete(assigned[2])  # the surviving attempt still counts
            rest = await node.acquire(10)
            assert (lost.session_id, 2) in [(a.session_id, a.attempt) for a in rest]
            for assignment in rest:
                assert await node.complete(assignment)
            run = await second.get_run(run_id)
            assert (run.state, run.sessions_succeeded, run.groups_delivered) == (rollout_pb2.RUN_STATE_COMPLETED, 6, 1)
            assert [g.task_id for g in await second.groups(run_id, start_after=1)] == ["task-1", "task-2"]


@pytest.mark.slow
async def test_etcd_stop_and_restart(tmp_path: Path, private_etcd: EtcdServer, etcd_prefix: str) -> None:
    config = settings(tmp_path / "rollout.sqlite", private_etcd.endpoint, etcd_prefix, leader_ttl_s=10)
    async with EtcdClient(private_etcd.endpoint) as etcd, start_rollout(config) as rollout:
        run_id = await rollout.create_run(make_spec(tasks=2, group_size=2))
        async with sim_node(etcd, rollout.stub, "a", ttl=10) as node:
            assigned = await node.acquire(2)
            private_etcd.stop()
            assert await node.complete(assigned[0])  # results do not need etcd (its key stays for now)
            assert (await rollout.get_run(run_id)).sessions_succeeded == 1
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await node.acquire(1)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (await rollout.get_run(run_id)).sessions_pending == 2  # the refused hand-out left no trace
            await asyncio.to_thread(restart_etcd, private_etcd)
            watch = rollout.core.watch
            await eventually(
                lambda: (watch.reconciliations, watch.watching.is_set()),
                15,
                what="the ownership watch back: (reconciliations >= 2, watching)",
                until=lambda seen: seen[0] >= 2 and seen[1],
            )
            assert await node.complete(assigned[1])
            for assignment in await node.acquire(2):
                assert await node.complete(assignment)
            # The key of the session completed while etcd was down was deleted by the reconciliation
            # (the node's lease, and so its keys, is still alive here).

            async def owner_keys() -> list[str]:
                return [item.key for item in (await etcd.get_prefix(f"{etcd_prefix}rollout/owners/")).items]

            await eventually(owner_keys, 5, what="stale ownership keys deleted", until=lambda keys: not keys)
        run = await rollout.get_run(run_id)
        assert (run.state, run.sessions_succeeded) == (rollout_pb2.RUN_STATE_COMPLETED, 4)
