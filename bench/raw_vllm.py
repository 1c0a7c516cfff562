"""lodestar Generate against raw vLLM: the same engine arguments, the same workload, phases interleaved.

Raw vLLM is what a user would run instead of lodestar's inference service: `AsyncLLM` in process, built
with exactly the arguments lodestar's vllm engine uses (`lodestar_inference.engines.vllm.engine_args`)
and the same `SamplingParams` per request (`VllmEngine.sampling_params`: seeded, logprobs on, DELTA
outputs when streaming, FINAL_ONLY when not), fed the prompt ids lodestar's chat template renders for the
same messages. It runs in a worker subprocess under .venv-vllm that takes one phase per stdin line.

lodestar is a real `lodestar inference serve --backend vllm` subprocess driven over gRPC from this process (the
client shares the machine's cores, as the gateway does). Each phase runs C closed-loop workers, each issuing
`ROUNDS[C]` (times `scale`) requests of `NEW_TOKENS` sampled tokens back to back; tok/s counts the sampled
tokens. Per repeat and cell the raw and lodestar phases run back to back, in a seeded random order; the ratio is
the median over repeats of lodestar / raw of the same repeat (load drifts cancel). Several lodestar servers
("variants": another commit's checkout, other flush settings) can run in the same interleaving, so a
before/after comparison comes from one run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
NEW_TOKENS = 128
CONCURRENCY = (1, 16, 64)
ROUNDS = {1: 8, 16: 4, 64: 2}
PROMPT = "Write a long story about the lighthouse keeper number {}."


def _seed(repeat: int, worker: int, round_: int) -> int:
    return 100_000 * repeat + 100 * worker + round_


def _max_tokens(phase: dict[str, Any], seed: int) -> int:
    """`NEW_TOKENS` per request; with `phase["spread"]` 64 to 191 (mean 127.5), the same for raw and lodestar
    (requests of a round then finish at different engine steps, as a real workload's do)."""
    return NEW_TOKENS // 2 + seed * 7919 % NEW_TOKENS if phase.get("spread") else NEW_TOKENS


# -- the raw side (runs under .venv-vllm: `python bench/raw_vllm.py MODEL_DIR KV_BYTES`) -------------


async def _raw_phase(llm: Any, info: Any, phase: dict[str, Any]) -> dict[str, float]:
    from vllm.inputs import tokens_input

    from lodestar_inference.engine import EngineRequest, SamplingOptions
    from lodestar_inference.engines.vllm import VllmEngine, _sampled_logprobs

    prompts: list[list[int]] = phase["prompts"]
    stream: bool = phase["stream"]
    first_tokens: list[float] = []

    async def one(worker: int, round_: int) -> int:
        seed = _seed(phase["repeat"], worker, round_)
        options = SamplingOptions(max_tokens=_max_tokens(phase, seed), seed=seed)
        request = EngineRequest(f"raw-{seed}", tuple(prompts[worker]), options, final_only=not stream)
        params = VllmEngine.sampling_params(request, info)
        ids: list[int] = []
        logprobs: list[float] = []
        started = time.perf_counter()
        async for out in llm.generate(tokens_input(prompts[worker]), params, f"raw-{seed}-{time.time_ns()}"):
            if not ids:
                first_tokens.append(time.perf_counter() - started)
            completion = out.outputs[0]
            new = list(completion.token_ids)
            ids += new
            logprobs += _sampled_logprobs(new, completion.logprobs)  # the flat lists, as lodestar reads them
        return len(ids)

    async def worker(index: int) -> int:
        return sum([await one(index, round_) for round_ in range(phase["rounds"])])

    started, cpu = time.perf_counter(), time.process_time()
    tokens = sum(await asyncio.gather(*(worker(i) for i in range(phase["c"]))))
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu  # this process only: vLLM's engine core and worker are other processes
    return {"tokens": tokens, "seconds": seconds, "ttft_ms": statistics.median(first_tokens) * 1e3, "cpu_s": cpu_s}


async def raw_worker(model_dir: Path, kv_cache_bytes: int) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from lodestar.heap import freeze_startup_heap
    from lodestar_inference.engine import EngineInfo
    from lodestar_inference.engines.vllm import engine_args
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.tokenizer import TextTokenizer

    config = json.loads((model_dir / "config.json").read_text())
    context = int(config["max_position_embeddings"])
    settings = InferenceSettings(backend="vllm", model=model_dir, kv_cache_bytes=kv_cache_bytes)
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args(settings, model_dir, context)))
    info = EngineInfo("vllm", context, int(config["vocab_size"]), TextTokenizer.load(model_dir).eos_token_ids)
    freeze_startup_heap()  # as `vllm serve` does after its startup (and lodestar's server after its own)
    loop = asyncio.get_running_loop()
    print("RESULT ready", flush=True)
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            result = await _raw_phase(llm, info, json.loads(line))
            print("RESULT " + json.dumps(result), flush=True)
    finally:
        llm.shutdown()


# -- the lodestar side and the driver (main venv) --------------------------------------------------


class RawVllm:
    """The raw-vLLM worker subprocess."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, model_dir: Path, kv_cache_bytes: int) -> RawVllm:
        python = REPO / ".venv-vllm" / "bin" / "python"
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        process = await asyncio.create_subprocess_exec(
            str(python), str(SCRIPT), str(model_dir), str(kv_cache_bytes),
            cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        raw = cls(process)
        await raw._result()
        return raw

    async def _result(self) -> Any:
        assert self._process.stdout is not None
        while line := (await self._process.stdout.readline()).decode():
            if line.startswith("RESULT "):
                return json.loads(line[7:]) if line[7:].strip() != "ready" else None
        raise RuntimeError(f"the raw vLLM worker exited ({await self._process.wait()})")

    async def phase(self, phase: dict[str, Any]) -> dict[str, float]:
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(phase) + "\n").encode())
        await self._process.stdin.drain()
        result: dict[str, float] = await self._result()
        return result

    async def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            await asyncio.wait_for(self._process.wait(), 60)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its threads, not its children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate_calls(stub: Any) -> Any:
    """One `Generate` call per generation (what a gRPC client of any language does)."""
    return lambda request: stub.Generate(request, timeout=600)


def generate_many(stub: Any) -> Any:
    """Generations as tags of one `GenerateMany` stream, through the gateway's own client."""
    from lodestar_gateway.inference_client import GenerateStreams

    streams = GenerateStreams(stub)
    return lambda request: streams.generate(request, 600.0)


async def _lodestar_phase(generate: Any, phase: dict[str, Any], pid: int | None = None) -> dict[str, float]:
    """One phase through `generate` (request -> async iterator of responses: `generate_calls(stub)` or
    `generate_many(stub)`); `pid`: the server, whose CPU counts with this process's."""
    from lodestar.v1 import common_pb2, inference_pb2

    first_tokens: list[float] = []

    async def one(worker: int, round_: int) -> int:
        seed = _seed(phase["repeat"], worker, round_)
        request = inference_pb2.GenerateRequest(
            messages=[_user(PROMPT.format(worker))],
            stream=phase["stream"],
            sampling=common_pb2.SamplingParams(seed=seed, max_tokens=_max_tokens(phase, seed)),
        )
        started = time.perf_counter()
        tokens = 0
        async for response in generate(request):
            if response.WhichOneof("event") == "delta":
                if not tokens:
                    first_tokens.append(time.perf_counter() - started)
                tokens += len(response.delta.token_ids)
            else:
                tokens = len(response.final.completion_token_ids)
        return tokens

    async def worker(index: int) -> int:
        return sum([await one(index, round_) for round_ in range(phase["rounds"])])

    started, cpu, server_cpu = time.perf_counter(), time.process_time(), process_cpu_s(pid) if pid else 0.0
    tokens = sum(await asyncio.gather(*(worker(i) for i in range(phase["c"]))))
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu + (process_cpu_s(pid) - server_cpu if pid else 0.0)  # client + server
    ttft_ms = statistics.median(first_tokens or [0.0]) * 1e3
    return {"tokens": tokens, "seconds": seconds, "ttft_ms": ttft_ms, "cpu_s": cpu_s}


def _user(text: str) -> Any:
    from lodestar.v1 import common_pb2

    return common_pb2.ChatMessage(
        role=common_pb2.ROLE_USER, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))]
    )


async def compare(
    variants: dict[str, tuple[str, int]],
    model_dir: Path,
    repeats: int,
    kv_cache_bytes: int,
    scale: int = 1,
    concurrency: tuple[int, ...] = CONCURRENCY,
    many: bool = True,
    calls_only: frozenset[str] = frozenset(),
    spread: bool = False,
    raw: RawVllm | None = None,
) -> dict[str, dict[str, float]]:
    """Medians per cell "c{C}-{stream|final}": raw tok/s and TTFT, and per lodestar variant (label -> server
    address and pid) and client ("LABEL, Generate": a call per generation; "LABEL, GenerateMany": the
    gateway's multiplexed stream, when `many` and the label is not in `calls_only`) its tok/s, ratio to raw
    and TTFT; for every side the front-end CPU per token (raw: the AsyncLLM process; lodestar: the server
    process plus the gRPC client; vLLM's engine-core and worker processes, the same work on both sides, are
    not counted), and the lowest and highest per-repeat ratio.
    Per repeat and cell all phases run back to back in a seeded random order (so that no side always follows
    the same other); `scale` multiplies the requests per worker (longer phases, less noise); `spread`: requests
    of 64 to 191 sampled tokens instead of 128 each (`_max_tokens`)."""
    import grpc.aio

    from lodestar.heap import freeze_startup_heap
    from lodestar.v1 import inference_pb2_grpc
    from lodestar_inference.templates import ChatTemplate
    from lodestar_inference.tokenizer import TextTokenizer

    template = ChatTemplate(TextTokenizer.load(model_dir))
    prompts = [list(template.prompt([_user(PROMPT.format(i))]).ids) for i in range(max(CONCURRENCY))]
    owned = raw is None  # (a `raw` the caller started is the caller's to close)
    raw = raw or await RawVllm.start(model_dir, kv_cache_bytes)
    channels = {label: grpc.aio.insecure_channel(address) for label, (address, _) in variants.items()}
    pids = {label: pid for label, (_, pid) in variants.items()}
    stubs = {label: inference_pb2_grpc.InferenceServiceStub(channel) for label, channel in channels.items()}
    clients: dict[str, tuple[Any, int]] = {}  # side -> (generate, server pid)
    for label, stub in stubs.items():
        clients[f"{label}, Generate"] = (generate_calls(stub), pids[label])
        if many and label not in calls_only:
            clients[f"{label}, GenerateMany"] = (generate_many(stub), pids[label])
    cells: dict[str, dict[str, list[float]]] = {}
    try:
        warm = {"c": 16, "rounds": 1, "stream": True, "repeat": 99, "prompts": prompts}
        await raw.phase(warm)
        for generate, _ in clients.values():
            await _lodestar_phase(generate, warm)
        freeze_startup_heap()  # this process is the gRPC client, in the gateway's place: as the gateway does
        for repeat in range(repeats):
            for number, (c, stream) in enumerate((c, s) for c in concurrency for s in (True, False)):
                phase = {
                    "c": c,
                    "rounds": ROUNDS[c] * scale,
                    "stream": stream,
                    "repeat": repeat,
                    "prompts": prompts,
                    "spread": spread,
                }
                cell = cells.setdefault(f"c{c}-{'stream' if stream else 'final'}", {})
                await _cell_phase(raw, clients, phase, random.Random(f"{repeat}-{number}"), cell)
    finally:
        if owned:
            await raw.close()
        for channel in channels.values():
            await channel.close()
    return _medians(cells, clients)


async def _cell_phase(
    raw: RawVllm,
    clients: dict[str, tuple[Any, int]],
    phase: dict[str, Any],
    order: random.Random,
    cell: dict[str, list[float]],
) -> None:
    """One phase of every side (raw and each lodestar client) in `order`'s shuffle; appends each side's tok/s,
    TTFT, ratio to raw and front-end CPU per token to `cell`."""
    sides = ["raw", *clients]
    got = {}
    for side in order.sample(sides, len(sides)):
        if side == "raw":
            got[side] = await raw.phase(phase)
        else:
            generate, pid = clients[side]
            got[side] = await _lodestar_phase(generate, phase, pid)
    rates = {side: got[side]["tokens"] / got[side]["seconds"] for side in got}
    for side in sides:
        cell.setdefault(side, []).append(rates[side])
        cell.setdefault(f"{side} ttft_ms", []).append(got[side]["ttft_ms"])
        cell.setdefault(f"{side} ratio", []).append(rates[side] / rates["raw"])
        cell.setdefault(f"{side} cpu_us", []).append(got[side]["cpu_s"] / got[side]["tokens"] * 1e6)
    print(f"repeat {phase['repeat']} c={phase['c']} stream={phase['stream']}: {json.dumps(rates)}", file=sys.stderr)


def _medians(cells: dict[str, dict[str, list[float]]], clients: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each cell's medians, and the lowest and highest per-repeat ratio of each lodestar client."""
    medians = {name: {key: statistics.median(values) for key, values in cell.items()} for name, cell in cells.items()}
    for name, cell in cells.items():
        for side in clients:
            medians[name][f"{side} ratio min"] = min(cell[f"{side} ratio"])
            medians[name][f"{side} ratio max"] = max(cell[f"{side} ratio"])
    return medians


def both_orders(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """One estimate from two runs, raw vLLM's engine started after the lodestar servers and before them: the
    engine started later runs faster (bench/results/inference-vs-raw-vllm.md, 2026-12-02), so each ratio is the
    geometric mean of the two runs' ratios (the start order's factor cancels if it is the same either way) and
    the two ratios are kept as "ratio after" / "ratio before"; tok/s, TTFT and CPU per token are the means of
    the two runs."""
    cells: dict[str, dict[str, float]] = {}
    for name, one in after.items():
        other = before[name]
        cell = cells[name] = {}
        for key, value in one.items():
            if key.endswith((" ratio min", " ratio max")):
                continue
            if key.endswith(" ratio"):
                cell[key] = math.sqrt(value * other[key])
                cell[f"{key} after"], cell[f"{key} before"] = value, other[key]
            else:
                cell[key] = (value + other[key]) / 2
    return cells


def sides(cells: dict[str, dict[str, float]]) -> list[str]:
    """The lodestar sides of `compare`'s cells ("LABEL, Generate", "LABEL, GenerateMany"), in run order."""
    first = next(iter(cells.values()))
    return [key for key in first if key != "raw" and key.endswith(("Generate", "GenerateMany"))]


def table(cells: dict[str, dict[str, float]], variants: list[str]) -> str:
    """The markdown table of `compare`'s cells (or `both_orders`': its ratios carry the two runs' instead of the
    per-repeat range)."""
    combined = any(key.endswith(" ratio after") for key in next(iter(cells.values())))
    bracket = "raw started after / before" if combined else "per-repeat range"
    lines = [
        f"| C | lodestar | raw AsyncLLM tok/s, streaming | lodestar, streaming | ratio ({bracket}) "
        f"| raw tok/s, non-streaming | lodestar, non-streaming | ratio ({bracket}) "
        "| TTFT raw / lodestar (streaming) "
        "| front-end CPU us/token raw / lodestar, streaming | non-streaming |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted({int(name[1:].split("-")[0]) for name in cells}):
        s, f = cells[f"c{c}-stream"], cells[f"c{c}-final"]
        for v in variants:
            lines.append(
                f"| {c} | {v} | {s['raw']:,.0f} | {s[v]:,.0f} | {_ratio(s, v)} | {f['raw']:,.0f} "
                f"| {f[v]:,.0f} | {_ratio(f, v)} | {s['raw ttft_ms']:.1f} / {s[v + ' ttft_ms']:.1f} ms "
                f"| {s['raw cpu_us']:.0f} / {s[v + ' cpu_us']:.0f} | {f['raw cpu_us']:.0f} / {f[v + ' cpu_us']:.0f} |"
            )
    return "\n".join(lines)


def _ratio(cell: dict[str, float], variant: str) -> str:
    if f"{variant} ratio after" in cell:
        after, before = cell[f"{variant} ratio after"], cell[f"{variant} ratio before"]
        return f"{cell[variant + ' ratio']:.2f}x ({after:.2f} / {before:.2f})"
    low, high = cell.get(f"{variant} ratio min"), cell.get(f"{variant} ratio max")
    spread = f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else ""
    return f"{cell[variant + ' ratio']:.2f}x{spread}"


if __name__ == "__main__":
    if len(sys.argv) != 3:  # `make bench` runs every script: this one is bench/inference.py's worker
        print("bench/raw_vllm.py is bench/inference.py's raw-vLLM worker (run `bench/inference.py --compare-raw`)")
        sys.exit(0)
    sys.path.insert(0, str(REPO))
    asyncio.run(raw_worker(Path(sys.argv[1]), int(sys.argv[2])))
