"""A test-only gRPC service whose requests say how to fail, served by the real `GrpcServer`.

Service `lodestar.test.Faulty`, raw bytes in and out (no protobuf), one method per RPC kind:
`Unary`, `ServerStream` (yields b"1", b"2" and then runs the command), `ClientStream` (runs the last
request it receives). A command is one of:

    ok:<text>                  answer <text>
    raise:<ErrorName>:<msg>    raise lodestar.errors.<ErrorName>(msg)
    crash:<msg>                raise RuntimeError(msg)  (a bug: must come back as INTERNAL, msg unseen)
    abort:<msg>                context.abort(PERMISSION_DENIED, msg)  (passes through untouched)
    sleep:<seconds>            print "started sleep" on stdout, sleep, answer b"slept"
    flaky:<key>:<n>[:<Error>]  UnavailableError (or lodestar.errors.<Error>) for the first n calls with
                               <key>, then the call count

Run as a script (`python tests/kernel/faulty_service.py --drain-seconds 5`) it prints `PORT <n>` once
SERVING and serves until SIGTERM, which drains it: the SIGTERM test uses it as a real server process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio

from lodestar import errors
from lodestar.grpc.server import GrpcServer

SERVICE = "lodestar.test.Faulty"


class FaultyService:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def run(self, command: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        verb, _, rest = command.decode().partition(":")
        if verb == "ok":
            return rest.encode()
        if verb == "raise":
            name, _, message = rest.partition(":")
            raise getattr(errors, name)(message)
        if verb == "crash":
            raise RuntimeError(rest)
        if verb == "abort":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, rest)
        if verb == "sleep":
            print("started sleep", flush=True)
            await asyncio.sleep(float(rest))
            return b"slept"
        if verb == "flaky":
            key, failures, *error_name = rest.split(":")
            self.calls[key] += 1
            if self.calls[key] <= int(failures):
                error = getattr(errors, error_name[0] if error_name else "UnavailableError")
                raise error(f"{key}: failing call {self.calls[key]} of {failures}")
            return str(self.calls[key]).encode()
        raise errors.InvalidArgumentError(f"unknown command {verb!r}")

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return await self.run(request, context)

    async def server_stream(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        yield b"1"
        yield b"2"
        yield await self.run(request, context)

    async def client_stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        last = b"ok:"
        async for request in requests:
            last = request
        return await self.run(last, context)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
                "ServerStream": grpc.unary_stream_rpc_method_handler(self.server_stream),
                "ClientStream": grpc.stream_unary_rpc_method_handler(self.client_stream),
            },
        )


def build_server(service: FaultyService, *, drain_seconds: float = 5.0) -> GrpcServer:
    server = GrpcServer("faulty", drain_seconds=drain_seconds)
    server.add_service(
        lambda handler, grpc_server: grpc_server.add_generic_rpc_handlers((handler,)), service.handler(), SERVICE
    )
    return server


def method(channel: grpc.aio.Channel, name: str) -> Any:
    """A callable for one Faulty method on `channel` (bytes in, bytes out)."""
    path = f"/{SERVICE}/{name}"
    if name == "Unary":
        return channel.unary_unary(path)
    if name == "ServerStream":
        return channel.unary_stream(path)
    return channel.stream_unary(path)


async def _main(drain_seconds: float) -> None:
    server = build_server(FaultyService(), drain_seconds=drain_seconds)
    port = await server.start()
    await server.set_serving(True)
    print(f"PORT {port}", flush=True)
    await server.wait_for_termination()
    print("drained", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--drain-seconds", type=float, default=5.0)
    asyncio.run(_main(parser.parse_args().drain_seconds))
    sys.exit(0)
