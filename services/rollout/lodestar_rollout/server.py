"""RolloutService server: gRPC (health, reflection, drain) around the leader role.

The server starts at once with health NOT_SERVING; the instance campaigns for leadership, and while it
leads health says SERVING and the RolloutService answers. A standby (another instance on the same
store and etcd prefix) stays NOT_SERVING and redirects callers to the leader. SIGTERM drains, steps
down (the lease is revoked, so a standby takes over at once) and stops.
"""

from __future__ import annotations

import asyncio
import contextlib

from lodestar.grpc.server import GrpcServer, service_name
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_rollout.leader import LeaderRole
from lodestar_rollout.servicer import RolloutServicer
from lodestar_rollout.settings import RolloutSettings
from lodestar_rollout.stores import describe

_log = get_logger("rollout.server")


class RolloutServer:
    """One rollout instance: the gRPC server plus its leader role."""

    def __init__(self, settings: RolloutSettings) -> None:
        self.settings = settings
        self.grpc = GrpcServer.for_settings("rollout", settings)
        self.role = LeaderRole(settings, self.grpc.set_serving)
        servicer = RolloutServicer(lambda: self.role.core, lambda: self.role.leader_address)
        self.grpc.add_service(
            rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
            servicer,
            service_name(rollout_pb2.DESCRIPTOR, "RolloutService"),
        )
        self._campaign: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.grpc.port

    async def start(self) -> int:
        port = await self.grpc.start()
        self.role.address = self.settings.advertise or f"{self.settings.host}:{port}"
        self._campaign = asyncio.create_task(self.role.run(), name="rollout-leadership")
        return port

    async def stop(self, grace: float | None = None) -> None:
        await self.grpc.stop(grace)
        await self.stop_role()

    async def stop_role(self) -> None:
        """Stop campaigning and leading (a leader revokes its lease, so a standby takes over at once)."""
        if self._campaign is not None:
            self._campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._campaign
        await self.role.stop()


async def serve(settings: RolloutSettings) -> None:
    server = RolloutServer(settings)
    await server.start()
    _log.info("rollout instance started", address=server.role.address, store=describe(settings.store))
    try:
        await server.grpc.wait_for_termination()
    finally:
        await server.stop_role()
