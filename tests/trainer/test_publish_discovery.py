"""Weight pushes to the inference replicas registered in etcd (`--inference-discovery etcd`): real inference
services (transformers backend, tiny model) registered as `inference serve --etcd` registers them
(lodestar_inference/registration.py), a real etcd, the trainer's publisher as `create_trainer` builds it.
One push reaches every registered replica and each rewrites its record with the version; a replica that
dies is skipped at once (the push does not wait for it) and leaves the publisher's targets when its lease
expires (and no longer holds up `lodestar train`'s wait for the final version before its [eval]); a replica
that joins later gets the next version; with no replica registered a push waits for one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lodestar.errors import DeadlineExceededError, UnavailableError
from lodestar.etcd import EtcdClient
from lodestar.inference_registry import ReplicaRegistration, list_replicas
from lodestar_app.cli.train_eval import wait_for_version
from lodestar_inference.registration import registration
from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.publish import FanoutPublisher
from lodestar_trainer.wiring import publisher_of
from tests.trainer.helpers import trainer_settings
from tests.trainer.inference_helpers import InferenceThread, served_version
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TTL_S = 2


@contextlib.contextmanager
def _replica(
    model: Path, spool: Path, name: str, etcd: str, prefix: str
) -> Iterator[tuple[InferenceThread, ReplicaRegistration]]:
    """An inference service registered in etcd as `inference serve --etcd` does it."""
    settings = {"replica_id": name, "etcd": etcd, "etcd_prefix": prefix, "etcd_lease_ttl_s": TTL_S}
    with InferenceThread.start(model, spool, **settings) as server:
        assert server._service is not None
        server._service.replica_id = name
        port = int(server.address.rsplit(":", 1)[1])
        keeper = registration(server.settings, server._service, port)
        assert keeper is not None
        server._run(_start(keeper))
        try:
            yield server, keeper
        finally:
            with contextlib.suppress(Exception):
                server._run(keeper.stop(), timeout=15)


async def _start(keeper: ReplicaRegistration) -> None:
    keeper.start()
    await keeper.wait_registered(10)


def _kill(server: InferenceThread, keeper: ReplicaRegistration) -> None:
    """What etcd and the trainer see of a SIGKILL: the port closes, keepalives stop, nothing is revoked."""

    async def die() -> None:
        await keeper.abandon()
        await server._server.stop(0)

    server._run(die())


def _registered_versions(etcd: str, prefix: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        async with EtcdClient(etcd) as client:
            replicas, _ = await list_replicas(client, prefix)
        return {r.record.replica_id: r.record.policy_version for r in replicas.values()}

    return asyncio.run(read())


def test_pushes_follow_the_replicas_registered_in_etcd(
    trainer_model_dir: Path, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    model = load_model(trainer_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    state = dedupe_tied(model, dict(model.state_dict()))
    settings = trainer_settings(
        inference_discovery="etcd", etcd=etcd_endpoint, etcd_prefix=etcd_prefix, push_timeout_s=30, push_attempts=3
    )
    with (
        _replica(trainer_model_dir, tmp_path / "a", "ra", etcd_endpoint, etcd_prefix) as (a, _),
        _replica(trainer_model_dir, tmp_path / "b", "rb", etcd_endpoint, etcd_prefix) as (b, b_keeper),
    ):
        publisher = publisher_of(settings)
        assert isinstance(publisher, FanoutPublisher)
        try:
            wait_until(lambda: set(publisher.target.split(",")) == {a.address, b.address}, 10, what="both replicas")
            assert publisher.publish(state, 1).policy_version == 1
            assert (served_version(a.address), served_version(b.address)) == (1, 1)
            wait_until(
                lambda: _registered_versions(etcd_endpoint, etcd_prefix) == {"ra": 1, "rb": 1},
                10,
                what="each replica's record naming the version it serves",
            )

            _kill(b, b_keeper)
            where = {"etcd": etcd_endpoint, "etcd_prefix": etcd_prefix}
            with pytest.raises(DeadlineExceededError, match=b.address):  # lodestar train's wait before [eval]
                asyncio.run(wait_for_version("", 1, timeout_s=0.2, **where))
            started = time.monotonic()
            assert publisher.publish(state, 2).policy_version == 2, "the survivor took it"
            assert time.monotonic() - started < 15, "the push did not wait out the dead replica"
            assert served_version(a.address) == 2
            wait_until(lambda: publisher.target == a.address, TTL_S + 10, what="the dead replica's lease expiring")
            asyncio.run(wait_for_version("", 2, timeout_s=10, **where))  # the dead one no longer holds it up

            with _replica(trainer_model_dir, tmp_path / "c", "rc", etcd_endpoint, etcd_prefix) as (c, _):
                wait_until(lambda: c.address in publisher.target, 10, what="the late replica discovered")
                assert served_version(c.address) == 0
                publisher.publish(state, 3)
                assert (served_version(a.address), served_version(c.address)) == (3, 3)
        finally:
            publisher.close()

        registered: list[str] = []  # no replica yet: a push waits for one (within its deadline)
        waiting = FanoutPublisher(lambda: list(registered), timeout_s=30, attempts=1)
        try:
            threading.Timer(0.5, registered.append, [a.address]).start()
            assert waiting.publish(state, 4).policy_version == 4
        finally:
            waiting.close()
    nobody = FanoutPublisher(list, timeout_s=0.5)
    with pytest.raises(UnavailableError, match="no inference replica is registered"):
        nobody.served_version()
    nobody.close()
