"""A replica killed and restarted at its address faster than its etcd lease expires (found by bench/chaos.py:
three calls served at v0 while the fleet served v7). The gateway still routes to the address: its key lives on
under the dead process's lease. The session pinned there must not sample from the restarted process's starting
weights: the call carries the version the gateway last saw that replica serve (`min_policy_version`), the new
process refuses it, and the call fails over to the other replica before its first token.

All real: etcd, two `lodestar inference serve` processes (the tiny model) registered in it, a gateway
ReplicaSet following them through discovery, real weight pushes. Then the floor's bookkeeping on its own."""

from __future__ import annotations

import asyncio
import os
import signal
from contextlib import AbstractContextManager
from pathlib import Path

from safetensors.torch import load_file

from bench.inference_servers import ServerProcess, serve_inference
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_app.local import free_port
from lodestar_gateway.replica_watch import ReplicaDiscovery
from lodestar_gateway.replicas import ReplicaSet
from tests.inference.helpers import channel, push_weights, sampling, user
from tests.waiting import eventually

LEASE_TTL_S = 120
"""Longer than the restart takes: the dead process's key is still there when the session calls."""
REFUSED = "refused a call that needs a newer policy version"
ServeContext = AbstractContextManager[ServerProcess]


def _serve(
    model_dir: Path, log_dir: Path, port: int, name: str, etcd: tuple[str, str] | None, ttl: int = LEASE_TTL_S
) -> ServeContext:
    registration = ("--etcd", etcd[0], "--etcd-prefix", etcd[1], "--etcd-lease-ttl-s", str(ttl)) if etcd else ()
    return serve_inference("transformers", model_dir, log_dir, "--replica-id", name, *registration, port=port)


async def _call(replicas: ReplicaSet, session: str) -> inference_pb2.GenerateFinal:
    request = inference_pb2.GenerateRequest(
        session_id=session, messages=[user("hello")], sampling=sampling(max_tokens=3, temperature=0.0)
    )
    finals = [response.final async for response in replicas.generate(request) if response.HasField("final")]
    return finals[-1]


async def test_a_replica_restarted_within_its_lease_does_not_serve_its_pinned_session_old_weights(
    tiny_model_dir: Path, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    etcd, ports = (etcd_endpoint, etcd_prefix), {"a": free_port(), "b": free_port()}
    replicas = ReplicaSet(())
    discovery = ReplicaDiscovery(replicas, etcd_endpoint, prefix=etcd_prefix)
    with (
        _serve(tiny_model_dir, tmp_path, ports["a"], "a", etcd) as a,
        _serve(tiny_model_dir, tmp_path, ports["b"], "b", etcd) as b,
    ):
        discovery.start()
        try:
            await eventually(lambda: set(replicas.clients) == {a.address, b.address}, 30, what="both routed")
            weights = load_file(str(tiny_model_dir / "model.safetensors"))
            for server in (a, b):  # the trainer's push: both serve v1
                async with channel(server.address) as pushed:
                    await push_weights(inference_pb2_grpc.InferenceServiceStub(pushed), weights, version=1)
            await eventually(lambda: replicas.floors == {a.address: 1, b.address: 1}, 30, what="both seen at v1")
            session = next(f"s{i}" for i in range(1000) if replicas.router.pick(f"s{i}") == a.address)
            first = await _call(replicas, session)
            assert (first.served_by, first.policy_version) == ("a", 1)

            os.kill(a.process.pid, signal.SIGKILL)
            a.process.wait()
            restart = _serve(tiny_model_dir, tmp_path, ports["a"], "a", None)  # unregistered: the window the nodes miss
            with restart as restarted:
                assert a.address in replicas.clients, "the dead process's key outlives it: still routed to"
                second = await _call(replicas, session)
                assert (second.served_by, second.policy_version) == ("b", 1), (
                    "the session's next call was served by the restarted replica's starting weights"
                )
                assert replicas.failovers == 1
                assert REFUSED in restarted.log()
        finally:
            await discovery.stop()
            await replicas.close()


async def test_a_replica_restarted_while_the_other_paused_past_its_lease_waits_and_the_call_is_held(
    tiny_model_dir: Path, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    """The chaos hour's second version fault: replica a restarted (v0, registered, waiting to catch up) while b,
    the only one at the run's version, was SIGSTOPped past its lease. The fleet's version fell to 0 and a
    served 14 calls at v0. Now nothing is routed while the fleet's version holds (Admission's grace), a call
    made then is held (ReplicaSet), and b, back and registered again, serves it at v1."""
    etcd, ports = (etcd_endpoint, etcd_prefix), {"a": free_port(), "b": free_port()}
    replicas = ReplicaSet(())
    discovery = ReplicaDiscovery(replicas, etcd_endpoint, prefix=etcd_prefix)
    with (
        _serve(tiny_model_dir, tmp_path, ports["a"], "a", etcd, ttl=2) as a,
        _serve(tiny_model_dir, tmp_path, ports["b"], "b", etcd, ttl=2) as b,
    ):
        discovery.start()
        try:
            await eventually(lambda: set(replicas.clients) == {a.address, b.address}, 30, what="both routed")
            weights = load_file(str(tiny_model_dir / "model.safetensors"))
            for server in (a, b):
                async with channel(server.address) as pushed:
                    await push_weights(inference_pb2_grpc.InferenceServiceStub(pushed), weights, version=1)
            await eventually(lambda: replicas.floors == {a.address: 1, b.address: 1}, 30, what="both seen at v1")

            os.kill(a.process.pid, signal.SIGKILL)
            a.process.wait()
            with _serve(tiny_model_dir, tmp_path, ports["a"], "a", etcd, ttl=2):
                await eventually(lambda: discovery.admission.waiting == {a.address: 0}, 30, what="a back at v0")
                os.kill(b.process.pid, signal.SIGSTOP)
                try:
                    await eventually(lambda: not replicas.clients, 30, what="b's key expired")
                    assert discovery.admission.waiting == {a.address: 0}, "a at v0 is not the fleet's version"
                    held = asyncio.ensure_future(_call(replicas, "s-held"))
                    await asyncio.sleep(1.0)
                    assert not held.done(), "no replica routed: the call waits"
                    assert replicas.held == 1
                finally:
                    os.kill(b.process.pid, signal.SIGCONT)
                final = await asyncio.wait_for(held, 60)
                assert (final.served_by, final.policy_version) == ("b", 1)
                assert a.address not in replicas.clients
        finally:
            await discovery.stop()
            await replicas.close()


async def test_a_floor_rises_with_what_a_replica_serves_and_restarts_with_a_new_process() -> None:
    replicas = ReplicaSet(["static:1"])
    replicas.served("static:1", 5)
    assert replicas.floors == {}, "a static address has no floor: nothing says which process answers it"
    replicas.add("a:1")
    replicas.served("a:1", 3, incarnation=11)
    replicas.served("a:1", 4)  # an answer at v4
    replicas.served("a:1", 2, incarnation=11)  # an older record of the same process does not lower it
    assert replicas.floors["a:1"] == 4
    replicas.served("a:1", 0, incarnation=12)  # a new process registered at the address (the whole fleet restarted)
    assert replicas.floors["a:1"] == 0
