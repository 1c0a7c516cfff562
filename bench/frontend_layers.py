"""Where the inference front-end's CPU goes, layer by layer, in one process (no gRPC, no second process).

bench/inference.py compares lodestar with raw vLLM end to end, across processes that share this machine's
2 cores, and its throughput ratios move with where the scheduler puts them (docs/benchmarks.md). This benchmark takes
the process boundaries away: one process runs lodestar's inference service on the vllm backend and drives
each layer of it directly with the same workload (bench/raw_vllm.py's prompt, 128 sampled tokens, seeded,
logprobs on, C closed-loop workers), and counts this process's CPU per sampled token (the front-end:
AsyncLLM's output handling plus what sits above it; vLLM's engine-core and worker processes, the same work
for every layer, are not counted). The layers, each including the ones below it:

- `raw AsyncLLM`: the AsyncLLM the service runs, consumed as a user of vLLM would (`AsyncLLM.generate`, a
  step per iteration: bench/raw_vllm.py's consumer);
- `VllmEngine`: lodestar's engine wrapper (`Engine.generate`, paced as Generation paces C streams when
  streaming, FINAL_ONLY when not);
- `Generation`: a Generate call without its transport (render the chat, decode, parse, the protobuf deltas
  and final);
- `Multiplexer`: GenerateMany's server half (tags, batches), still without gRPC.

What the gRPC server and client add on top is bench/inference.py's "CPU" column minus the `Multiplexer` row.
Phases are interleaved per repeat (the order rotating) and every figure is the median over repeats.
Usage: `.venv-vllm/bin/python bench/frontend_layers.py [--repeats 6] [--write-docs] 2>LOG` (the service's
JSON log lines go to stderr, as the server's go to its log file).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the server runs (tests/inference/conftest.py)

from bench.raw_vllm import NEW_TOKENS, PROMPT, _raw_phase, _user  # noqa: E402
from bench.vllm_venv import ensure_vllm  # noqa: E402

SECTION = "## Inference front-end CPU by layer, in process (bench/frontend_layers.py)"
LAYERS = ("raw AsyncLLM", "VllmEngine", "Generation", "Multiplexer")
CONCURRENCY = (16, 64)
ROUNDS = {16: 6, 64: 3}
"""Requests per worker and phase (phases of ~12,000 and ~25,000 sampled tokens)."""
KV_CACHE_BYTES = 512 * 1024**2


async def closed_loop(c: int, rounds: int, one: Callable[[int, int], Awaitable[int]]) -> int:
    """`c` workers, each `rounds` calls of `one(worker, seed)` back to back; the tokens they sampled."""

    async def worker(index: int) -> int:
        return sum([await one(index, 1000 * round_ + index) for round_ in range(rounds)])

    return sum(await asyncio.gather(*(worker(i) for i in range(c))))


class Layers:
    """One closed-loop phase through each layer of a started vLLM inference service, driven one by one: the raw
    AsyncLLM under it, its engine adapter, its Generation, and the Multiplexer of GenerateMany over that."""

    def __init__(self, service: Any) -> None:
        self.engine, self.generation = service._engine, service._generation  # the layers themselves
        self.llm, self.info = self.engine._llm, self.engine.info()
        self.prompts = [list(service.template.prompt([_user(PROMPT.format(i))]).ids) for i in range(max(CONCURRENCY))]

    def runs(self) -> dict[str, Callable[[int, bool, int], Awaitable[int]]]:
        """Layer name (`LAYERS`) -> its phase (c, stream, repeat) -> tokens sampled."""
        return dict(zip(LAYERS, (self.raw, self.engine_adapter, self.generation_run, self.multiplexer), strict=True))

    @staticmethod
    def request(worker: int, seed: int, stream: bool) -> Any:
        from lodestar.v1 import common_pb2, inference_pb2

        sampling = common_pb2.SamplingParams(seed=seed, max_tokens=NEW_TOKENS)
        return inference_pb2.GenerateRequest(messages=[_user(PROMPT.format(worker))], stream=stream, sampling=sampling)

    async def raw(self, c: int, stream: bool, repeat: int) -> int:
        phase = {"c": c, "rounds": ROUNDS[c], "stream": stream, "repeat": repeat, "prompts": self.prompts}
        return int((await _raw_phase(self.llm, self.info, phase))["tokens"])

    async def engine_adapter(self, c: int, stream: bool, repeat: int) -> int:
        from lodestar_inference.engine import EngineRequest, SamplingOptions

        hold = self.generation.stream_interval(running=c - 1) if stream else 0.0  # Generation's pace, c streams

        async def one(worker: int, seed: int) -> int:
            options = SamplingOptions(max_tokens=NEW_TOKENS, seed=seed)
            request = EngineRequest(
                f"e{seed}", tuple(self.prompts[worker]), options, final_only=not stream, hold_s=hold
            )
            return sum([len(step.token_ids) async for step in self.engine.generate(request)])

        return await closed_loop(c, ROUNDS[c], one)

    async def generation_run(self, c: int, stream: bool, repeat: int) -> int:
        async def one(worker: int, seed: int) -> int:
            async for response in self.generation.run(self.request(worker, seed, stream)):
                if response.HasField("final"):
                    return len(response.final.completion_token_ids)
            raise AssertionError("a generation ended without its final response")

        return await closed_loop(c, ROUNDS[c], one)

    async def multiplexer(self, c: int, stream: bool, repeat: int) -> int:
        from lodestar_inference.multiplex import Multiplexer

        multiplexer = Multiplexer(self.generation.run)
        finals: dict[int, asyncio.Future[int]] = {}
        loop = asyncio.get_running_loop()

        async def one(worker: int, seed: int) -> int:
            tag = len(finals) + 1
            finals[tag] = loop.create_future()
            multiplexer.start(tag, self.request(worker, seed, stream))
            return await finals[tag]

        async def read() -> None:
            async for batch in multiplexer.batches():
                for tag, outcome in batch:
                    if isinstance(outcome, Exception):
                        finals[tag].set_exception(outcome)
                    elif outcome.HasField("final"):
                        finals[tag].set_result(len(outcome.final.completion_token_ids))

        reader = asyncio.create_task(read())
        tokens = await closed_loop(c, ROUNDS[c], one)
        multiplexer.end_input()
        await reader
        return tokens


async def measure(model_dir: Path, repeats: int) -> dict[tuple[int, bool, str], list[float]]:
    """CPU microseconds per sampled token, per (C, streaming, layer), one value per repeat."""
    from lodestar_inference.service import InferenceService
    from lodestar_inference.settings import InferenceSettings

    settings = InferenceSettings(backend="vllm", model=model_dir, kv_cache_bytes=KV_CACHE_BYTES, max_new_tokens=4096)
    service = InferenceService.create(settings)
    await service.start()
    runs = Layers(service).runs()
    results: dict[tuple[int, bool, str], list[float]] = {}
    try:
        for run in runs.values():  # warm every path once
            await run(16, True, 99)
        gc.collect()
        gc.freeze()  # as the server does after its startup (lodestar.heap)
        for repeat in range(repeats):
            for number, (c, stream) in enumerate((c, s) for c in CONCURRENCY for s in (True, False)):
                shift = (repeat + number) % len(LAYERS)
                for layer in LAYERS[shift:] + LAYERS[:shift]:
                    cpu = time.process_time()
                    tokens = await runs[layer](c, stream, repeat)
                    results.setdefault((c, stream, layer), []).append((time.process_time() - cpu) / tokens * 1e6)
                print(f"repeat {repeat} c={c} stream={stream} done", flush=True)
    finally:
        await service.close()
    return results


def table(results: dict[tuple[int, bool, str], list[float]]) -> str:
    lines = [
        "| C | mode | " + " | ".join(f"{layer} us/token" for layer in LAYERS) + " | lodestar's layers above raw |",
        "|---|---|" + "---|" * len(LAYERS) + "---|",
    ]
    for c in CONCURRENCY:
        for stream in (True, False):
            medians = [statistics.median(results[(c, stream, layer)]) for layer in LAYERS]
            cells = [f"{medians[0]:.1f}"] + [f"{m:.1f} ({m - prev:+.1f})" for prev, m in itertools.pairwise(medians)]
            mode = "streaming" if stream else "non-streaming"
            lines.append(f"| {c} | {mode} | " + " | ".join(cells) + f" | {medians[-1] - medians[0]:+.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if not ensure_vllm(__file__):
        return
    from lodestar.logging import configure_logging

    configure_logging("info", json=True)  # as the server logs (its log is a file): one JSON line per generation
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = Path(scratch) / "tiny"
            subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "lodestar_app.cli.main", "model", "init-tiny",
                            str(model)], check=True, cwd=REPO)  # fmt: skip
        results = asyncio.run(measure(model, args.repeats))
    text = table(results)
    print(text)
    if args.write_docs:
        from bench.docs_section import RAW_VLLM_LOG, replace_section

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        header = (
            f"{SECTION}\n\nCommit {commit.stdout.strip()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{args.repeats} repeats, {ROUNDS[16]} (C=16) and {ROUNDS[64]} (C=64) requests per worker and phase, "
            f"{NEW_TOKENS} sampled tokens each. Each cell: the "
            "layer's CPU per sampled token in the front-end process (median over repeats), and in brackets what it "
            "adds to the layer on its left.\n\n"
        )
        replace_section(SECTION, header + text + "\n", RAW_VLLM_LOG)


if __name__ == "__main__":
    main()
