"""Where the time to first token goes through lodestar's vLLM server: before the server, in the engine, after.

One `lodestar inference serve --backend vllm` subprocess, C closed-loop streaming workers in this process
(the client), the workload of bench/raw_vllm.py (a ~33-token prompt, 128 sampled tokens, or 64-191 with
spread lengths), driven by one `Generate` call per generation and over GenerateMany. Every request carries
its own `request_id`; the client records (wall clock) when it started the request and when its first delta
arrived, and the server's `generate` log line gives, for the same id, when `Generation.run` started
(its timestamp minus `duration_ms`) and when the engine's first step came (`first_token_ms` later). So each
TTFT splits into:
- client -> server: from the client's start to `Generation.run` (client call set-up, transport, gRPC's
  accept of the call or read of the GenerateMany message, the server's event loop);
- engine: `Generation.run` to the engine's first step (render, `add_request`, queueing and prefill in vLLM);
- server -> client: the first delta's way back (the rest).

Both clocks are the same machine's `time.time()`; the log line's timestamp is taken a few microseconds after
`duration_ms`. Medians over every request of every repeat. Usage:

    .venv-vllm/bin/python bench/ttft_split.py [--concurrency 16 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.inference import KV_CACHE_BYTES  # noqa: E402  (the server's KV cache of the other inference benchmarks)
from bench.raw_vllm import PROMPT, ROUNDS, _max_tokens, _user, generate_calls, generate_many  # noqa: E402


async def _phase(
    generate: Any, tag: str, c: int, rounds: int, spread: bool, marks: dict[str, tuple[float, float]]
) -> None:
    """C workers x `rounds` streaming requests; `marks[request_id]` = (started, first delta), wall clock."""
    from lodestar.v1 import common_pb2, inference_pb2

    async def one(worker: int, round_: int) -> None:
        seed = 100 * worker + round_
        request_id = f"{tag}-{worker}-{round_}-{uuid.uuid4().hex[:8]}"
        request = inference_pb2.GenerateRequest(
            messages=[_user(PROMPT.format(worker))],
            stream=True,
            request_id=request_id,
            sampling=common_pb2.SamplingParams(seed=seed, max_tokens=_max_tokens({"spread": spread}, seed)),
        )
        started, first = time.time(), 0.0
        async for response in generate(request):
            if not first and response.WhichOneof("event") == "delta":
                first = time.time()
        marks[request_id] = (started, first)

    async def worker(index: int) -> None:
        for round_ in range(rounds):
            await one(index, round_)

    await asyncio.gather(*(worker(i) for i in range(c)))


def _server_marks(log: Path) -> dict[str, tuple[float, float]]:
    """request_id -> (Generation.run started, engine's first step), wall clock, from the server's log."""
    marks = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"event": "generate"' not in line:
            continue
        entry = json.loads(line)
        ended = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
        started = ended - entry["duration_ms"] / 1e3
        marks[entry["request_id"]] = (started, started + entry["first_token_ms"] / 1e3)
    return marks


def _split(client: dict[str, tuple[float, float]], server: dict[str, tuple[float, float]]) -> dict[str, float]:
    parts: dict[str, list[float]] = {"ttft": [], "to server": [], "engine": [], "to client": []}
    for request_id, (started, first) in client.items():
        if request_id not in server or not first:
            continue
        run, step = server[request_id]
        parts["ttft"].append(first - started)
        parts["to server"].append(run - started)
        parts["engine"].append(step - run)
        parts["to client"].append(first - step)
    split = {name: statistics.median(values) * 1e3 for name, values in parts.items() if values}
    split["n"] = len(parts["ttft"])
    return split


async def measure(address: str, log: Path, concurrency: list[int], repeats: int) -> list[tuple[str, dict[str, float]]]:
    import grpc.aio

    from lodestar.v1 import inference_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    clients = {"Generate": generate_calls(stub), "GenerateMany": generate_many(stub)}
    marks: dict[str, dict[str, tuple[float, float]]] = {}
    try:
        await _phase(clients["GenerateMany"], "warm", 16, 1, False, {})
        for repeat in range(repeats):
            for c in concurrency:
                for spread in (False, True):
                    for name, generate in clients.items():
                        cell = f"{c}|{'64-191' if spread else '128'}|{name}"
                        await _phase(generate, f"r{repeat}", c, ROUNDS[c], spread, marks.setdefault(cell, {}))
    finally:
        await channel.close()
    await asyncio.sleep(0.5)  # the last log lines
    server = _server_marks(log)
    return [(cell, _split(client, server)) for cell, client in marks.items()]


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| C | sampled tokens | client | requests | TTFT | client -> Generation.run | engine's first step "
        "| first delta -> client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, s in rows:
        c, tokens, client = cell.split("|")
        lines.append(
            f"| {c} | {tokens} | {client} | {s['n']:.0f} | {s['ttft']:.1f} ms | {s['to server']:.1f} ms "
            f"| {s['engine']:.1f} ms | {s['to client']:.1f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 64], choices=sorted(ROUNDS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    args = parser.parse_args()

    from bench.inference_servers import serve_inference
    from lodestar_inference.tiny_model import build

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or build(Path(scratch) / "tiny")
        extra = ["--max-new-tokens", "4096", "--kv-cache-bytes", str(KV_CACHE_BYTES)]
        with serve_inference("vllm", model, Path(scratch), *extra) as server:
            rows = asyncio.run(measure(server.address, server.log_path, args.concurrency, args.repeats))
    print(table(rows))


if __name__ == "__main__":
    main()
