"""An `inference serve --etcd` process in etcd (lodestar_inference/registration.py): once it serves, its key
names its replica id and address; SIGTERM removes the key at once (the drain begins by leaving etcd), long
before its lease would expire."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from lodestar.etcd import EtcdClient
from lodestar.inference_registry import RegisteredReplica, list_replicas
from tests.inference.conftest import serve_inference
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
LEASE_TTL_S = 60


def _registered(etcd: str, prefix: str) -> dict[str, RegisteredReplica]:
    async def read() -> dict[str, RegisteredReplica]:
        async with EtcdClient(etcd) as client:
            replicas, _ = await list_replicas(client, prefix)
        return {r.record.replica_id: r for r in replicas.values()}

    return asyncio.run(read())


def test_a_replica_registers_while_it_serves_and_leaves_when_it_drains(
    tiny_model_dir: Path, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    flags = ["--replica-id", "r-test", "--etcd", etcd_endpoint, "--etcd-prefix", etcd_prefix]
    flags += ["--etcd-lease-ttl-s", str(LEASE_TTL_S)]
    with serve_inference("scripted", tiny_model_dir, tmp_path, *flags) as server:
        found = wait_until(lambda: _registered(etcd_endpoint, etcd_prefix), 20, what="the replica's key")
        record = found["r-test"].record
        assert (record.address, record.policy_version) == (server.address, 0)
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        wait_until(lambda: not _registered(etcd_endpoint, etcd_prefix), 10, what="the key gone on SIGTERM")
        assert time.monotonic() - started < LEASE_TTL_S / 2, "revoked, not expired"
        server.process.wait(timeout=30)
