"""A gateway node process: GatewayService (gRPC) and the vendor-API HTTP port on one event loop.

`GatewayNode` wires the capture store, the session registry, the inference client, the proxy, the
aiohttp application and the gRPC server; `serve` runs it until SIGTERM/SIGINT, then drains both ports.
With `--etcd` the node registers itself in etcd (`membership.py`) while it serves; etcd being down
does not stop it serving. With `--inference-discovery etcd` its inference replicas are those registered in
etcd (`replica_watch.py`). With `--rollout` (and `--etcd`) the node also runs sessions: its
`NodeLifecycle` (`node/lifecycle.py`) pulls them from rollout and runs their harnesses; without it the
node only proxies sessions opened through `OpenSession`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from datetime import UTC, datetime

from aiohttp import web

from lodestar.errors import DeadlineExceededError, InvalidArgumentError
from lodestar.etcd import tls_from_settings
from lodestar.grpc.client import split_targets
from lodestar.grpc.server import GrpcServer, service_name
from lodestar.heap import freeze_startup_heap
from lodestar.logging import get_logger
from lodestar.v1 import gateway_pb2, gateway_pb2_grpc
from lodestar_gateway.app import GatewayHttp
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.http_tls import exposure_warning, ssl_context
from lodestar_gateway.inference_client import GrpcInference
from lodestar_gateway.membership import Membership, NodeRecord
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.harnesses.run_groups import RunGroups
from lodestar_gateway.node.harnesses.sandbox import node_sandbox
from lodestar_gateway.node.lifecycle import LifecycleConfig, NodeLifecycle
from lodestar_gateway.node.rollout_client import GrpcRollout, RetryPolicy, RolloutLink
from lodestar_gateway.node.runtimes import DockerBackend, HostBackend, Runtimes
from lodestar_gateway.node.stages import ATTEMPT_LABEL, SessionStages
from lodestar_gateway.proxy import InferenceBackend, Proxy
from lodestar_gateway.quotas import QuotaLimits
from lodestar_gateway.replica_watch import ReplicaDiscovery
from lodestar_gateway.replicas import ReplicaSet
from lodestar_gateway.retention import Retention, RetentionPolicy
from lodestar_gateway.servicer import GatewayServicer
from lodestar_gateway.sessions import SessionRegistry
from lodestar_gateway.settings import GatewaySettings
from lodestar_gateway.unknown_fields import UnknownFields

_log = get_logger("gateway")
CAPTURE_FILE = "capture.sqlite"
DISCOVERY_WAIT_S = 5.0
"""How long start() waits for the first listing of discovered inference replicas."""


class GatewayNode:
    """Everything one gateway process serves."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        inference: InferenceBackend | None = None,
        rollout: RolloutLink | None = None,
    ) -> None:
        if (settings.rollout or rollout is not None) and not settings.etcd:
            raise InvalidArgumentError("--rollout needs --etcd: session ownership is bound to the node's etcd lease")
        self.settings = settings
        self._etcd_tls = tls_from_settings(settings.etcd, settings) if settings.etcd else None
        self.node_id = settings.node_id or f"{socket.gethostname()}-{os.getpid()}"
        if settings.inference_discovery == "etcd" and not settings.etcd:
            raise InvalidArgumentError("--inference-discovery etcd needs --etcd: replicas register there")
        self._own_inference = inference is None
        self.inference: InferenceBackend = inference or inference_backend(settings)
        self.discovery: ReplicaDiscovery | None = None
        self.store = CaptureStore(settings.data_dir / CAPTURE_FILE, synchronous=settings.capture_synchronous)
        self.sessions = SessionRegistry(self.store)
        self.retention = Retention(
            self.store,
            self.sessions,
            RetentionPolicy(
                acknowledged_s=settings.capture_retention_s,
                unacknowledged_s=settings.capture_retention_unacknowledged_s,
                sweep_s=settings.capture_sweep_s,
            ),
        )
        self.proxy = Proxy(self.inference, self.store, unknown_fields=UnknownFields(strict=settings.strict_fields))
        self.grpc = GrpcServer.for_settings("gateway", settings)
        self.grpc.add_service(
            gateway_pb2_grpc.add_GatewayServiceServicer_to_server,
            GatewayServicer(self, self.sessions, self.store, self.proxy),
            service_name(gateway_pb2.DESCRIPTOR, "GatewayService"),
        )
        self._runner: web.AppRunner | None = None
        self.http_port = 0
        self.membership: Membership | None = None
        self._own_rollout: GrpcRollout | None = None
        if rollout is None and settings.rollout:
            rollout = self._own_rollout = GrpcRollout(settings.rollout)
        self._rollout = rollout
        self.lifecycle: NodeLifecycle | None = None
        self.runtimes: Runtimes | None = None

    @property
    def capacity(self) -> int:
        """Sessions this node runs at once (0 when it only proxies)."""
        return self.lifecycle.capacity if self.lifecycle is not None else 0

    def stage_counts(self) -> dict[str, int]:
        return self.lifecycle.stage_counts() if self.lifecycle is not None else {}

    def _build_lifecycle(self, rollout: RolloutLink) -> NodeLifecycle:
        settings = self.settings
        sessions_dir = settings.sessions_dir or settings.data_dir / "sessions"
        launcher = Launcher(
            isolate_network=settings.isolate_network,
            mount_namespaces=settings.mount_namespaces,
            sandbox=node_sandbox(settings.data_dir, sessions_dir, settings.sandbox_hidden)
            if settings.host_sandbox == "bwrap"
            else None,
            relay_connections=settings.relay_max_connections,
            groups=RunGroups(settings.data_dir / "run-groups"),
        )
        if launcher.sandbox is None:
            _log.warning("host sessions run without the sandbox (host_sandbox = namespaces): not for untrusted agents")
        self.runtimes = Runtimes(
            {
                "host": HostBackend(sessions_dir, launcher, fixed_root=settings.session_root),
                "docker": DockerBackend(
                    sessions_dir,
                    node_id=self.node_id,
                    fixed_root=settings.session_root,
                    bin_dir=settings.harness_bin_dir,
                    mounts_allowed=settings.docker_mounts_allowed,
                    relay_connections=settings.relay_max_connections,
                ),
            }
        )
        stages = SessionStages(
            sessions=self.sessions,
            store=self.store,
            proxy=self.proxy,
            launcher=launcher,
            runtimes=self.runtimes,
            base_url=self.http_base_url,
            default_model=settings.default_model,
            bin_dir=settings.harness_bin_dir,
        )
        config = LifecycleConfig(
            slots=settings.slots,
            ready_buffer=settings.ready_buffer,
            init_workers=settings.init_workers,
            post_workers=settings.post_workers,
            poll_interval_s=settings.poll_interval_s,
            default_session_timeout_s=settings.default_session_timeout_s,
            default_agent_timeout_s=settings.default_agent_timeout_s,
            report=RetryPolicy(attempts=settings.complete_attempts),
            shutdown_timeout_s=settings.shutdown_timeout_s,
            drain_grace_s=settings.drain_grace_s,
        )
        membership = self.membership

        def lease() -> int | None:
            return membership.lease_id if membership else None

        return NodeLifecycle(self.node_id, rollout, stages, lease, config, retention=self.retention)

    @property
    def inference_target(self) -> str:
        """The inference addresses (discovered ones: `etcd:` and those routed to now)."""
        if self.settings.inference_discovery == "etcd" and isinstance(self.inference, ReplicaSet):
            return f"etcd:{self.inference.target}"
        return self.settings.inference

    @property
    def http_base_url(self) -> str:
        scheme = "https" if self.settings.http_tls_cert is not None else "http"
        return f"{scheme}://{self.settings.http_host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.settings.host}:{self.grpc.port}"

    async def start(self) -> None:
        """Open the store, bind both ports, report SERVING."""
        await self.store.open()
        discovered = self.settings.inference_discovery == "etcd" and isinstance(self.inference, ReplicaSet)
        if self.settings.etcd and discovered:
            assert isinstance(self.inference, ReplicaSet)
            self.discovery = ReplicaDiscovery(
                self.inference, self.settings.etcd, prefix=self.settings.etcd_prefix, tls=self._etcd_tls
            )
            self.discovery.start()  # list the replicas before serving (etcd down: they come later)
            with contextlib.suppress(DeadlineExceededError):
                await self.discovery.watch.wait_listed(DISCOVERY_WAIT_S)
        await self.sessions.load()
        orphans = await self.sessions.close_orphans(ATTEMPT_LABEL)
        if orphans:  # their attempts died with the earlier process; rollout requeues them
            _log.warning("closed sessions left open by an earlier process", count=len(orphans))
        for session_id in orphans:
            await self.retention.reported(session_id, acknowledged=False)
        self.retention.start()
        quotas = QuotaLimits(
            max_calls=self.settings.session_max_calls,
            max_concurrent=self.settings.session_max_concurrent_calls,
            max_request_bytes=self.settings.session_max_request_bytes,
        )
        http = GatewayHttp(self.proxy, self.sessions, max_body_bytes=self.settings.max_body_bytes, quotas=quotas)
        self._runner = web.AppRunner(http.application(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        tls = ssl_context(self.settings.http_tls_cert, self.settings.http_tls_key)
        site = web.TCPSite(self._runner, self.settings.http_host, self.settings.http_port, ssl_context=tls)
        if (warning := exposure_warning(self.settings.http_host, tls is not None)) is not None:
            _log.warning(warning, http_host=self.settings.http_host)
        await site.start()
        self.http_port = self._runner.addresses[0][1]
        await self.grpc.start()
        await self.grpc.set_serving(True)
        _log.info(
            "gateway serving",
            node_id=self.node_id,
            grpc=self.grpc_address,
            http=self.http_base_url,
            inference=self.inference_target,
            data_dir=str(self.settings.data_dir),
        )
        if self.settings.etcd:
            self.membership = Membership(
                self.settings.etcd,
                self.node_record(),
                ttl=self.settings.etcd_lease_ttl_s,
                prefix=self.settings.etcd_prefix,
                tls=self._etcd_tls,
            )
            self.membership.start()
        if self._rollout is not None:
            self.lifecycle = self._build_lifecycle(self._rollout)
            assert self.runtimes is not None
            removed = await self.runtimes.remove_leftovers()
            if removed:
                _log.warning("removed session runtimes left by an earlier process", count=removed)
            self.lifecycle.start()
            _log.info(
                "node lifecycle running",
                rollout=settings_rollout(self.settings),
                slots=self.settings.slots,
                ready_buffer=self.settings.ready_buffer,
            )

    def node_record(self) -> NodeRecord:
        """What this node announces in etcd (capacity 0 when it only proxies)."""
        capacity = self.settings.slots if self._rollout is not None else 0
        return NodeRecord(
            node_id=self.node_id,
            grpc_address=self.grpc_address,
            http_base_url=self.http_base_url,
            inference=self.inference_target,
            capacity=capacity,
            started_at=datetime.now(UTC),
        )

    async def stop(self, grace: float | None = None) -> None:
        """Stop the lifecycle (kill and report in-flight sessions, remove their workspaces), leave etcd (the
        node key and its session ownership keys are deleted at once), then drain: stop taking calls, let
        running ones finish (up to the drain time), close the store."""
        if self.lifecycle is not None:
            await self.lifecycle.stop()
            self.lifecycle = None
        await self.retention.close()
        if self.runtimes is not None:
            await self.runtimes.close()
        if self._own_rollout is not None:
            await self._own_rollout.close()
            self._own_rollout = None
        if self.membership is not None:
            await self.membership.stop()
            self.membership = None
        await self.grpc.stop(grace)
        if self.discovery is not None:
            await self.discovery.stop()
            self.discovery = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._own_inference and isinstance(self.inference, GrpcInference | ReplicaSet):
            await self.inference.close()
        await self.store.close()


def inference_backend(settings: GatewaySettings) -> GrpcInference | ReplicaSet:
    """One replica's client, or a ReplicaSet (session affinity, failover) when `inference` names several or
    replicas are discovered in etcd (filled by `ReplicaDiscovery`)."""
    if settings.inference_discovery == "etcd":
        return ReplicaSet((), timeout_s=settings.request_timeout_s, load_factor=settings.inference_load_factor)
    targets = split_targets(settings.inference)
    if len(targets) == 1:
        return GrpcInference(targets[0], timeout_s=settings.request_timeout_s)
    return ReplicaSet(targets, timeout_s=settings.request_timeout_s, load_factor=settings.inference_load_factor)


def settings_rollout(settings: GatewaySettings) -> str:
    return settings.rollout or "(in-process)"


async def serve(settings: GatewaySettings) -> None:
    node = GatewayNode(settings)
    await node.start()
    freeze_startup_heap()
    # Our own signal handling (not GrpcServer.wait_for_termination): on SIGTERM the node must leave etcd
    # before draining, or rollout would keep handing it work for the whole drain.
    loop = asyncio.get_running_loop()
    terminate = asyncio.Event()

    def on_signal(signum: int) -> None:
        _log.info("signal received", signal=signal.Signals(signum).name)
        terminate.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await terminate.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await node.stop()
