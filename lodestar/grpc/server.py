"""A gRPC server with the parts every lodestar service needs.

`GrpcServer` serves `grpc.health.v1.Health` (NOT_SERVING until `set_serving()`; the service "liveness" is
SERVING from start to shutdown, for liveness probes), server reflection for
every registered service, the error-mapping/logging interceptor, and a graceful drain: on SIGTERM or
SIGINT health flips to NOT_SERVING, new RPCs are refused and in-flight ones get `drain_seconds` to finish.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import structlog
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lodestar.grpc.errors import RpcInterceptor
from lodestar.grpc.security import Security, check_exposure, current
from lodestar.settings import ServiceSettings

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest message a server sends and a client channel receives (a group of long sessions, a session with
its calls): the receiving side of a client trusts the servers it connected to."""
DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""Largest request a server accepts unless its settings say otherwise (`max_receive_message_bytes`): what
one caller may make the server buffer is sized per service, not left at the send limit."""

LIVENESS_SERVICE = "liveness"
"""Health-check service name that is SERVING from start until shutdown, whatever the readiness (a standby
or a loading model is alive but not ready): the target of liveness probes."""


def server_options(max_receive_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_receive_message_bytes),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]


class _MethodAwarePool:
    """The default descriptor pool, also resolving method names ("pkg.Service.Method") to their file.

    protobuf's upb pool finds services and messages but not methods, so reflection answered NOT_FOUND
    to `grpcurl describe pkg.Service.Method` (and to clients that look up a method before calling it).
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            service = self._pool.FindServiceByName(service_name)  # KeyError: not found either
            if method not in service.methods_by_name:
                raise
            return service.file


class GrpcServer:
    """One grpc.aio server with health, reflection, interceptors and signal-driven drain."""

    def __init__(
        self,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_seconds: float = 10.0,
        security: Security | None = None,
        allow_insecure: bool = False,
        max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    ) -> None:
        """`security` (TLS, control-plane token) defaults to the process's `lodestar.grpc.security.current()`.
        A server for an address beyond loopback with neither a token nor mutual TLS is refused here
        (FailedPreconditionError, before anything is built or bound) unless `allow_insecure`."""
        self.name = name
        self._address = f"{host}:{port}"
        self._drain_seconds = drain_seconds
        self._security = current() if security is None else security
        self._exposed = check_exposure(host, self._security, allow_insecure=allow_insecure, what=f"{name} gRPC")
        interceptors = [*self._security.server_interceptors(), RpcInterceptor(name)]
        self._server = grpc.aio.server(interceptors=interceptors, options=server_options(max_receive_message_bytes))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._services: list[str] = []
        self._stopped = asyncio.Event()
        self._on_drain: list[Callable[[], None]] = []
        self._log = structlog.get_logger(component=name)
        self.port = 0

    @classmethod
    def for_settings(cls, name: str, settings: ServiceSettings, *, security: Security | None = None) -> GrpcServer:
        """A server bound, drained, exposed and limited as a service's settings say."""
        return cls(
            name,
            host=settings.host,
            port=settings.port,
            drain_seconds=settings.drain_seconds,
            security=security,
            allow_insecure=settings.allow_insecure,
            max_receive_message_bytes=settings.max_receive_message_bytes,
        )

    def add_service(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        """Register a servicer (`add_XServicer_to_server`, the servicer, its full proto name)."""
        register(servicer, self._server)
        self._services.append(full_name)

    def on_drain(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the drain begins (e.g. a long-lived stream stops taking new work and ends
        once its work in flight is done, instead of being cancelled at the end of the grace period)."""
        self._on_drain.append(callback)

    @property
    def services(self) -> list[str]:
        return list(self._services)

    async def start(self) -> int:
        """Bind and start serving (health NOT_SERVING); returns the bound port."""
        if self._exposed:
            self._log.warning(
                "serving beyond loopback WITHOUT authentication (--allow-insecure): anyone who reaches this port "
                "can use every RPC",
                address=self._address,
            )
        reflection.enable_server_reflection(
            [*self._services, health.SERVICE_NAME, reflection.SERVICE_NAME],
            self._server,
            pool=_MethodAwarePool(descriptor_pool.Default()),
        )
        credentials = self._security.server_credentials()
        if credentials is None:
            self.port = self._server.add_insecure_port(self._address)
        else:
            self.port = self._server.add_secure_port(self._address, credentials)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC port {self._address}")
        await self.set_serving(False)
        await self._health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self._server.start()
        self._log.info(
            "grpc server started",
            address=self._address,
            port=self.port,
            services=self._services,
            tls=credentials is not None,
            mutual_tls=self._security.tls_ca is not None,
            control_plane_token=self._security.authenticates,
            token_roles=self._security.table is not None,
        )
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Flip the overall ("") and per-service health status."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ["", *self._services]:
            await self._health.set(service, status)

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new RPCs, give in-flight ones `grace` seconds, then cancel them."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self._health.enter_graceful_shutdown()
        for callback in self._on_drain:
            callback()
        drain = self._drain_seconds if grace is None else grace
        self._log.info("grpc server draining", grace_seconds=drain)
        await self._server.stop(drain)
        self._log.info("grpc server stopped")

    async def wait_for_termination(self) -> None:
        """Serve until SIGTERM/SIGINT (then drain) or until `stop()` is called elsewhere."""
        loop = asyncio.get_running_loop()
        stop_task: asyncio.Task[None] | None = None

        def on_signal(signum: int) -> None:
            nonlocal stop_task
            self._log.info("signal received", signal=signal.Signals(signum).name)
            if stop_task is None:
                stop_task = asyncio.ensure_future(self.stop())

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            await self._server.wait_for_termination()
            if stop_task is not None:
                await stop_task
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)


def service_name(file_descriptor: Any, service: str) -> str:
    """Full proto name of `service` declared in a generated module's DESCRIPTOR."""
    name: str = file_descriptor.services_by_name[service].full_name
    return name


async def serve_until_terminated(server: GrpcServer) -> None:
    """Start `server`, report SERVING, and block until a signal has drained it."""
    await server.start()
    await server.set_serving(True)
    await server.wait_for_termination()
