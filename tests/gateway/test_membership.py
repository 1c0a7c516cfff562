"""Gateway node membership in a real etcd: the node's key appears with its record, leaves with SIGTERM /
stop at once, vanishes a TTL after SIGKILL, and comes back after etcd was down (at start or later)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.etcd import EtcdClient
from lodestar_gateway.membership import Membership, NodeRecord, list_nodes, node_key
from lodestar_gateway.server import GatewayNode
from lodestar_gateway.settings import GatewaySettings
from tests.conftest import EtcdServer, free_port
from tests.etcd_support import restart_etcd

REPO = Path(__file__).resolve().parents[2]
TTL_S = 2


def _settings(tmp_path: Path, etcd: str, prefix: str, **fields: object) -> GatewaySettings:
    values: dict[str, object] = {
        "port": 0,
        "http_port": 0,
        "inference": f"127.0.0.1:{free_port()}",  # nothing there: membership does not need inference
        "data_dir": tmp_path / "gateway",
        "drain_seconds": 0.5,
        "etcd": etcd,
        "etcd_prefix": prefix,
        "etcd_lease_ttl_s": TTL_S,
        "node_id": "node-a",
    }
    values.update(fields)
    return GatewaySettings(**values)  # type: ignore[arg-type]


async def _wait_for(predicate_key: str, client: EtcdClient, *, present: bool, within: float) -> float:
    """Seconds until `predicate_key` is present/absent; fails after `within` seconds."""
    started = time.monotonic()
    while (await client.get(predicate_key) is not None) != present:
        assert time.monotonic() - started < within, f"{predicate_key} still {'absent' if present else 'present'}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def _serving(node: GatewayNode) -> None:
    """Both ports answer: gRPC health says SERVING and the HTTP port answers HEAD /."""
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    async with aiohttp.ClientSession() as http, http.head(f"{node.http_base_url}/") as response:
        assert response.status == 200


async def test_node_registers_with_its_record_and_stop_removes_the_key(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    node = GatewayNode(_settings(tmp_path, etcd_endpoint, etcd_prefix, etcd_lease_ttl_s=30))
    async with EtcdClient(etcd_endpoint) as etcd:
        await node.start()
        try:
            assert node.membership is not None
            await node.membership.wait_registered(timeout=10)
            raw = await etcd.get(node_key("node-a", etcd_prefix))
            assert raw is not None
            assert raw.lease_id == node.membership.lease_id
            document = json.loads(raw.value)
            assert set(document) == {"node_id", "grpc_address", "http_base_url", "inference", "capacity", "started_at"}
            assert document["node_id"] == "node-a"
            assert document["grpc_address"] == node.grpc_address
            assert document["http_base_url"] == node.http_base_url
            assert document["inference"] == node.inference_target
            assert document["capacity"] == 0
            (listed,) = await list_nodes(etcd, etcd_prefix)
            assert listed.record == NodeRecord.from_json(raw.value)
            assert listed.lease_id == raw.lease_id
            assert abs(time.time() - listed.record.started_at.timestamp()) < 30
            await _serving(node)
        finally:
            await node.stop(grace=0.5)
        # Revoked, not expired: a 30 s lease, yet the key is gone as soon as stop() returns.
        assert await etcd.get(node_key("node-a", etcd_prefix)) is None
        assert await list_nodes(etcd, etcd_prefix) == []


@contextmanager
def _gateway_process(
    tmp_path: Path, etcd: str, prefix: str, node_id: str, ttl: int
) -> Iterator[subprocess.Popen[bytes]]:
    command = [
        sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--port", "0", "--http-port", "0",
        "--inference", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / node_id), "--etcd", etcd,
        "--etcd-prefix", prefix, "--etcd-lease-ttl-s", str(ttl), "--node-id", node_id, "--drain-seconds", "0.5",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.slow
async def test_sigterm_removes_the_key_at_once(tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> None:
    key = node_key("node-term", etcd_prefix)
    async with EtcdClient(etcd_endpoint) as etcd:
        with _gateway_process(tmp_path, etcd_endpoint, etcd_prefix, "node-term", ttl=30) as process:
            await _wait_for(key, etcd, present=True, within=30)
            os.kill(process.pid, signal.SIGTERM)
            gone_after = await _wait_for(key, etcd, present=False, within=10)
            assert process.wait(10) == 0
        assert gone_after < 5, f"key took {gone_after:.1f} s to go: expired (30 s TTL) rather than revoked?"


@pytest.mark.slow
async def test_sigkill_key_vanishes_after_the_ttl(tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> None:
    key = node_key("node-kill", etcd_prefix)
    async with EtcdClient(etcd_endpoint) as etcd:
        with _gateway_process(tmp_path, etcd_endpoint, etcd_prefix, "node-kill", ttl=TTL_S) as process:
            await _wait_for(key, etcd, present=True, within=30)
            await asyncio.sleep(TTL_S)  # the keepalive holds it past one TTL while the node lives
            assert await etcd.get(key) is not None
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
            assert await etcd.get(key) is not None, "nobody revoked it: it must outlive the process for a while"
            gone_after = await _wait_for(key, etcd, present=False, within=TTL_S + 5)
        assert gone_after <= TTL_S + 1


@pytest.mark.slow
async def test_etcd_down_at_start_node_serves_and_registers_when_etcd_comes_up(
    tmp_path: Path, private_etcd: EtcdServer, etcd_prefix: str
) -> None:
    private_etcd.stop()
    node = GatewayNode(_settings(tmp_path, private_etcd.endpoint, etcd_prefix))
    await node.start()
    try:
        membership = node.membership
        assert membership is not None
        await _serving(node)  # proxying does not wait for etcd
        await asyncio.sleep(1.0)
        assert not membership.is_registered
        restart_etcd(private_etcd)
        await membership.wait_registered(timeout=20)
        async with EtcdClient(private_etcd.endpoint) as etcd:
            (listed,) = await list_nodes(etcd, etcd_prefix)
            assert listed.record.node_id == "node-a"
            assert listed.lease_id == membership.lease_id
        await _serving(node)
    finally:
        await node.stop(grace=0.5)


@pytest.mark.slow
async def test_lost_lease_re_registers_when_etcd_is_back(
    tmp_path: Path, private_etcd: EtcdServer, etcd_prefix: str
) -> None:
    record = NodeRecord("node-b", "127.0.0.1:1", "http://127.0.0.1:2", "127.0.0.1:3", 4, datetime.now(UTC))
    membership = Membership(private_etcd.endpoint, record, ttl=TTL_S, prefix=etcd_prefix, retry_max_s=0.5)
    membership.start()
    try:
        await membership.wait_registered(timeout=10)
        first_lease = membership.lease_id
        private_etcd.stop()
        deadline = time.monotonic() + TTL_S + 5
        while membership.is_registered:  # the keepalive goes unanswered for a whole TTL: lost
            assert time.monotonic() < deadline, "lease never reported lost with etcd down"
            await asyncio.sleep(0.05)
        restart_etcd(private_etcd)
        await membership.wait_registered(timeout=20)
        assert membership.registrations == 2
        assert membership.lease_id != first_lease
        async with EtcdClient(private_etcd.endpoint) as etcd:
            await asyncio.sleep(TTL_S + 1)  # the old lease (restored by etcd) has expired by now
            (listed,) = await list_nodes(etcd, etcd_prefix)
            assert listed.record == record
            assert listed.lease_id == membership.lease_id
    finally:
        await membership.stop()
