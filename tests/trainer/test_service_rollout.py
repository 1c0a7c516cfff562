"""The trainer on the real RolloutService (in-process, real etcd, real SQLite): a simulated gateway node
completes the sessions of a run, the trainer reads the run's groups with StreamGroups(tokens_only), trains
one step per group and reports each new policy version back to rollout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio

from lodestar.etcd import EtcdClient
from lodestar.grpc.client import LEADER_METADATA_KEY
from lodestar.grpc.server import GrpcServer, service_name
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_trainer.data.synthetic import synthetic_group
from lodestar_trainer.rollout_client import RolloutClient
from lodestar_trainer.status import Phase
from lodestar_trainer.wiring import create_trainer
from tests.rollout.helpers import make_spec, settings, sim_node, start_rollout
from tests.trainer.groups_helpers import RUN, SHAPE, RolloutStandIn, make_group
from tests.trainer.groups_helpers import start_rollout as start_rollout_standin
from tests.trainer.helpers import trainer_settings
from tests.waiting import eventually

REWARDS = (1.0, 0.0, 0.5, 0.0)


async def test_trainer_consumes_a_real_rollout_run(
    trainer_model_dir: Path, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    config = settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)
    async with EtcdClient(etcd_endpoint) as etcd, start_rollout(config) as rollout:
        run_id = await rollout.create_run(make_spec(tasks=2, group_size=4))
        async with sim_node(etcd, rollout.stub, "node-a") as node:
            assigned = await node.acquire(8)
            by_group: dict[str, list] = {}
            for assignment in assigned:
                by_group.setdefault(assignment.group_id, []).append(assignment)
            assert sorted(len(sessions) for sessions in by_group.values()) == [4, 4]
            for seed, sessions in enumerate(by_group.values()):
                calls = synthetic_group(SHAPE, group_size=4, seed=seed, group_id=f"g{seed}")
                for assignment, session_calls, reward in zip(sessions, calls, REWARDS, strict=True):
                    for call in session_calls:
                        call.session_id = assignment.session_id
                    assert await node.complete(assignment, reward=reward, calls=session_calls)

        trained = trainer_settings(
            run=run_id, model=trainer_model_dir, rollout=rollout.address, inference="",
            run_dir=tmp_path / "trainer", steps=2, lr=1e-3, micro_batch_tokens=512,
        )  # fmt: skip
        trainer = await asyncio.to_thread(create_trainer, trained)
        await asyncio.wait_for(asyncio.to_thread(trainer.run), 120)
        status = trainer.board.snapshot()
        assert (status.phase, status.step, status.policy_version) == (Phase.STOPPED, 2, 2), status.error
        assert status.last_record is not None
        assert status.last_record.values["samples"] == 4
        run = await rollout.get_run(run_id)
        assert (run.groups_delivered, run.policy_version) == (2, 2)


async def test_the_group_stream_reconnects_after_the_groups_it_already_read() -> None:
    groups = [make_group(seed) for seed in range(3)]
    first = RolloutStandIn(groups[:2], hold=True)
    server, address = await start_rollout_standin(first)
    client = RolloutClient(address, RUN)
    received: list[str] = []
    reader = asyncio.create_task(asyncio.to_thread(lambda: received.extend(g.group_id for g in client.groups(0))))
    try:
        await eventually(lambda: list(received), 60, what="the first two groups", until=lambda ids: ids == ["g0", "g1"])
        await server.stop(0)  # rollout goes away mid-stream (a restart, a new leader)
        await asyncio.sleep(0.5)
        second = RolloutStandIn(groups)  # the same groups, and one more; this stream ends after them
        restarted, _ = await start_rollout_standin(second, port=int(address.rsplit(":", 1)[1]))
        await asyncio.wait_for(reader, 30)
        assert received == ["g0", "g1", "g2"]
        # one stream per group asked for: the stand-in ignores max_groups and sends g2, then the next
        # request (start_after 3) gets nothing, which ends the iteration
        assert [(request.start_after, request.max_groups) for request in second.requests] == [(2, 1), (3, 1)]
        await restarted.stop(0)
    finally:
        client.close()
        await asyncio.wait_for(reader, 10)


class Follower(rollout_pb2_grpc.RolloutServiceServicer):
    """A rollout instance that does not lead: every call is UNAVAILABLE naming the leader."""

    def __init__(self, leader: str) -> None:
        self.leader = leader

    async def _redirect(self, context: grpc.aio.ServicerContext) -> None:
        context.set_trailing_metadata(((LEADER_METADATA_KEY, self.leader),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")

    async def StreamGroups(self, request, context):  # type: ignore[no-untyped-def]
        await self._redirect(context)
        yield rollout_pb2.StreamGroupsResponse()

    async def ReportPolicyVersion(self, request, context):  # type: ignore[no-untyped-def]
        await self._redirect(context)


async def test_a_follower_sends_the_trainer_to_the_leader() -> None:
    leader = RolloutStandIn([make_group(0), make_group(1)])
    leader_server, leader_address = await start_rollout_standin(leader)
    follower_server = GrpcServer("rollout-follower", port=0, drain_seconds=0.5)
    follower_server.add_service(
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        Follower(leader_address),
        service_name(rollout_pb2.DESCRIPTOR, "RolloutService"),
    )
    follower_port = await follower_server.start()
    client = RolloutClient(f"127.0.0.1:{follower_port}", RUN)
    try:
        received = await asyncio.to_thread(lambda: [group.group_id for group in client.groups(0)])
        assert received == ["g0", "g1"]
        assert client.target == leader_address
        await asyncio.to_thread(client.report_policy_version, 4)
        assert leader.reported == [4]
    finally:
        client.close()
        await follower_server.stop(0)
        await leader_server.stop(0)
