"""The services on a 3-member etcd cluster (three local etcd processes): the rollout leader and two
simulated gateway nodes connect with all three endpoints; the raft leader, which is also the member
their channels use, is SIGKILLed mid-run. The run still completes with every session counted exactly
once, the rollout keeps its leadership term and the nodes keep their leases: losing one member loses
nothing. A real gateway node process keeps its membership (same lease) through the same loss."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from lodestar.errors import UnavailableError
from lodestar.etcd import EtcdClient
from lodestar.v1 import rollout_pb2
from lodestar_app.local import free_port, wait_serving
from lodestar_gateway.membership import node_key
from tests.etcd_support import EtcdCluster
from tests.rollout.helpers import make_spec, settings, sim_node, start_rollout

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    started = EtcdCluster(tmp_path / "etcd")
    try:
        yield started
    finally:
        started.stop()


async def _retrying(call: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    """What a gateway node does: retry a call that failed with UNAVAILABLE (etcd electing a leader)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_losing_one_etcd_member_mid_run_loses_nothing(
    cluster: EtcdCluster, tmp_path: Path, etcd_prefix: str
) -> None:
    victim = cluster.leader()
    endpoints = cluster.endpoints(first=victim)  # the channels start on the member that will die
    config = settings(tmp_path / "rollout.sqlite", endpoints, etcd_prefix, leader_ttl_s=5)
    async with (
        EtcdClient(endpoints) as etcd,
        start_rollout(config) as rollout,
        sim_node(etcd, rollout.stub, "a", ttl=5) as a,
        sim_node(etcd, rollout.stub, "b", ttl=5) as b,
    ):
        run_id = await rollout.create_run(make_spec(tasks=4, group_size=2))
        first = await a.acquire(3)
        second = await b.acquire(3)
        assert len(first) == len(second) == 3
        assert await a.complete(first[0])
        assert await b.complete(second[0])

        cluster.kill(victim)

        for node, held in ((a, first[1:]), (b, second[1:])):
            for assignment in held:
                assert await _retrying(lambda n=node, s=assignment: n.complete(s))  # type: ignore[misc]
        rest = await _retrying(lambda: a.acquire(8))
        assert len(rest) == 2
        for assignment in rest:
            assert await _retrying(lambda s=assignment: a.complete(s))  # type: ignore[misc]

        run = await _retrying(lambda: rollout.get_run(run_id))
        assert run.state == rollout_pb2.RUN_STATE_COMPLETED
        assert (run.sessions_succeeded, run.sessions_running, run.sessions_pending) == (8, 0, 0)
        groups = await rollout.groups(run_id)
        sessions = [s.session_id for g in groups for s in g.sessions]
        assert len(groups) == 4
        assert len(sessions) == len(set(sessions)) == 8
        assert all(s.attempt == 1 for g in groups for s in g.sessions)  # nothing was requeued
        assert rollout.server.role.terms == 1  # leadership survived the member's loss
        assert not a.lease.is_lost
        assert not b.lease.is_lost
        assert cluster.leader() != victim


@pytest.mark.slow
async def test_a_gateway_node_keeps_its_membership_when_its_member_dies(
    cluster: EtcdCluster, tmp_path: Path, etcd_prefix: str
) -> None:
    """A real `lodestar gateway serve` process given all three endpoints: after the member its channel
    uses is killed, its node key stays, on the same lease, for two lease TTLs."""
    victim = cluster.leader()
    endpoints = cluster.endpoints(first=victim)
    port, ttl = free_port(), 5
    argv = [sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--port", str(port), "--http-port", "0"]
    argv += ["--etcd", endpoints, "--etcd-prefix", etcd_prefix, "--etcd-lease-ttl-s", str(ttl)]
    argv += ["--node-id", "gw-cluster", "--data-dir", str(tmp_path / "gateway"), "--inference", "127.0.0.1:1"]
    with (tmp_path / "gateway.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    key = node_key("gw-cluster", etcd_prefix)
    try:
        await wait_serving(f"127.0.0.1:{port}", 60, process)
        async with EtcdClient(endpoints) as etcd:
            deadline = time.monotonic() + 20
            while (before := await etcd.get(key)) is None:
                assert time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()[-2000:]
                await asyncio.sleep(0.1)
            cluster.kill(victim)
            await asyncio.sleep(2 * ttl)
            after = await _retrying_etcd(lambda: etcd.get(key))
        assert after is not None, (tmp_path / "gateway.log").read_text()[-2000:]
        assert after.lease_id == before.lease_id  # never lost, never re-registered
        assert process.returncode is None
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(20):
            await process.wait()


async def _retrying_etcd(call: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
