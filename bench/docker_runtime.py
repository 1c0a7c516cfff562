"""What the `docker` runtime costs per session, on this machine's Docker daemon: container create (INIT),
a trivial harness `docker exec` + the kill after it (RUN overhead), a verifier `docker exec` (with the
restart the kill made necessary) and removal, over N sequential sessions from lodestar/session-base.

    python bench/docker_runtime.py [--sessions 10] [--image lodestar/session-base:dev]

Prints one JSON line: median and max seconds of each step. Needs a running dockerd and the image
(`make session-image`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint
from lodestar_gateway.node.runtimes import DockerBackend


async def _serve_gateway() -> tuple[asyncio.Server, str]:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def measure(sessions: int, image: str) -> dict[str, dict[str, float]]:
    steps: dict[str, list[float]] = {"create": [], "harness": [], "verifier": [], "cleanup": []}
    server, base_url = await _serve_gateway()
    with tempfile.TemporaryDirectory() as tmp:
        backend = DockerBackend(Path(tmp) / "sessions", node_id="bench")
        spec = rollout_pb2.RuntimeSpec(kind="docker", image=image, cpus=1, memory_bytes=1 << 30, pids_limit=256)
        try:
            for index in range(sessions):
                started = time.monotonic()
                runtime = await backend.create(f"bench-a{index}", {"task.txt": "x"}, spec, {"session": "bench"})
                created = time.monotonic()
                prepared = Command(["true"]).prepare(runtime.real, GatewayEndpoint(base_url, "k", "m"), "p")
                await runtime.run_harness(runtime.translate(prepared), base_url, 60)
                ran = time.monotonic()
                await runtime.run_process(["true"], {}, 60)
                verified = time.monotonic()
                await runtime.cleanup()
                done = time.monotonic()
                durations = (created - started, ran - created, verified - ran, done - verified)
                for name, seconds in zip(steps, durations, strict=True):
                    steps[name].append(seconds)
        finally:
            await backend.close()
            server.close()
    return {
        name: {"median_s": round(statistics.median(values), 3), "max_s": round(max(values), 3)}
        for name, values in steps.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--image", default="lodestar/session-base:dev")
    args = parser.parse_args()
    steps = asyncio.run(measure(args.sessions, args.image))
    print(json.dumps({"sessions": args.sessions, "image": args.image, **steps}))


if __name__ == "__main__":
    main()
