"""Leader election between two `lodestar rollout serve` processes on one store: the standby is
NOT_SERVING and redirects callers to the leader; SIGKILL of the leader -> the standby takes over
(reconciling from the store and etcd) and the run completes with every session counted once."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.etcd import EtcdClient
from lodestar.etcd import Lease as EtcdLease
from lodestar.grpc.client import LEADER_METADATA_KEY, LeaderChannel, connect, leader_from_error
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import free_port, wait_serving
from lodestar_rollout.leader import leader_key
from tests.rollout.helpers import make_spec, settings, sim_node, start_rollout, wait_leading
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
LEADER_TTL_S = 2


@contextmanager
def _serve(store: Path, etcd: str, prefix: str, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        sys.executable,
        "-m",
        "lodestar_app.cli.main",
        "rollout",
        "serve",
        "--port",
        str(port),
        "--etcd",
        etcd,
        "--etcd-prefix",
        prefix,
        "--store",
        str(store),
        "--leader-ttl-s",
        str(LEADER_TTL_S),
        "--log-json",
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _sync_redirect(address: str) -> str | None:
    """The leader a standby names to a synchronous client (as the trainer's)."""
    with grpc.insecure_channel(address) as channel:
        try:
            rollout_pb2_grpc.RolloutServiceStub(channel).GetRun(rollout_pb2.GetRunRequest(run_id="x"), timeout=5)
        except grpc.RpcError as error:
            return leader_from_error(error)  # type: ignore[arg-type]
    return None


async def _health(address: str) -> int:
    async with connect(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return int(reply.status)


@pytest.mark.slow
async def test_standby_redirects_then_takes_over_when_the_leader_is_killed(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    store = tmp_path / "rollout.sqlite"
    ports = free_port(), free_port()
    leader_address, standby_address = (f"127.0.0.1:{p}" for p in ports)
    with _serve(store, etcd_endpoint, etcd_prefix, ports[0], tmp_path / "a.log") as leader:
        await wait_serving(leader_address, 30)
        with _serve(store, etcd_endpoint, etcd_prefix, ports[1], tmp_path / "b.log"):
            await eventually(  # the standby starts, campaigns and finds the leader
                lambda: asyncio.to_thread(_sync_redirect, standby_address), 30, what="the standby to name the leader"
            )
            assert await _health(standby_address) == health_pb2.HealthCheckResponse.NOT_SERVING
            async with connect(standby_address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await rollout_pb2_grpc.RolloutServiceStub(channel).GetRun(rollout_pb2.GetRunRequest(run_id="x"))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (LEADER_METADATA_KEY, leader_address) in tuple(caught.value.trailing_metadata() or ())
            assert leader_address in (caught.value.details() or "")

            assert await asyncio.to_thread(_sync_redirect, standby_address) == leader_address

            client = LeaderChannel(standby_address)  # follows the redirect to the leader
            reply = await client.call(
                lambda ch: rollout_pb2_grpc.RolloutServiceStub(ch).CreateRun(
                    rollout_pb2.CreateRunRequest(spec=make_spec(tasks=2, group_size=2))
                )
            )
            run_id = reply.run.run_id
            assert client.target == leader_address
            await client.close()

            async with (
                EtcdClient(etcd_endpoint) as etcd,
                connect(leader_address) as first,
                sim_node(etcd, rollout_pb2_grpc.RolloutServiceStub(first), "node", ttl=10) as node,
            ):
                assigned = await node.acquire(3)
                assert await node.complete(assigned[0])
                os.kill(leader.pid, signal.SIGKILL)
                killed = time.monotonic()
                await wait_serving(standby_address, LEADER_TTL_S + 10)
                took_over = time.monotonic() - killed
                async with connect(standby_address) as second:
                    node.stub = rollout_pb2_grpc.RolloutServiceStub(second)
                    for assignment in assigned[1:]:  # attempts of the dead leader's term still count
                        assert await node.complete(assignment)
                    for assignment in await node.acquire(3):
                        assert await node.complete(assignment)
                    run = (await node.stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id))).run
    assert took_over < LEADER_TTL_S + 5
    assert (run.state, run.sessions_succeeded, run.groups_complete) == (rollout_pb2.RUN_STATE_COMPLETED, 4, 2)
    with sqlite3.connect(store) as db:
        counted = db.execute("SELECT COUNT(*), COUNT(DISTINCT session_id) FROM results WHERE counted = 1").fetchone()
    assert counted == (4, 4)


async def test_a_leader_that_loses_its_lease_steps_down_and_leads_again_from_the_store(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    config = settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)
    async with start_rollout(config) as rollout, EtcdClient(etcd_endpoint) as etcd:
        run_id = await rollout.create_run(make_spec(tasks=2, group_size=1))
        stream = asyncio.create_task(rollout.groups(run_id))
        await eventually(lambda: run_id in rollout.core._run_events, 10, what="the group stream waiting on the run")
        leader = await etcd.get(leader_key(etcd_prefix))
        assert leader is not None
        await EtcdLease(etcd, leader.lease_id, 2, expires_at=0).revoke()  # as if etcd expired it
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stream, 10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # open streams end: reconnect
        await wait_leading(rollout.server, 15)
        assert rollout.server.role.terms == 2
        assert (await rollout.get_run(run_id)).sessions_pending == 2  # state reloaded from the store
        assert await _health(rollout.address) == health_pb2.HealthCheckResponse.SERVING
