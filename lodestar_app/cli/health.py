"""`lodestar health HOST:PORT [--service NAME]`: exit 0 when the gRPC health check answers SERVING.

Used by container health checks and scripts; prints the status either way.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.grpc.security import current
from lodestar_app.cli import client_security


async def _check(address: str, service: str, timeout: float) -> str:
    async with current().aio_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def _handle(args: argparse.Namespace) -> int:
    status = asyncio.run(_check(args.address, args.service, args.timeout_s))
    print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("health", help="check a service's gRPC health (exit 0 when SERVING)")
    parser.add_argument("address", metavar="HOST:PORT", help="address of the service to check")
    parser.add_argument("--service", default="", help="service name (default: the whole server)")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="seconds to wait for the reply (default 3)")
    client_security.add_arguments(parser)
    parser.set_defaults(handler=client_security.secured(_handle))
