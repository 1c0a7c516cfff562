"""Inference benchmark: tokens/s at concurrency 1 and 16, time to first token, cost of logprob capture.

For each backend (transformers in .venv; vllm when .venv-vllm exists) on the offline tiny model:
- through a real `lodestar inference serve` subprocess over gRPC: generated tokens/s at concurrency 1 and
  16 (streaming, 128 new tokens per request) and time to first token for a short (~30 tokens) and a long
  (~8,000 tokens) prompt;
- in process, on the engine itself (the server always captures logprobs): tokens/s at concurrency 16
  with logprob capture on vs off. For vllm this part runs under .venv-vllm's python (`--engine-only`).

- with vllm: lodestar `Generate` against raw vLLM (`AsyncLLM` in process with lodestar's exact engine arguments,
  the same workload) at concurrency 1, 16 and 64, streaming and non-streaming, phases interleaved in a random
  order, the ratio to raw per cell (`bench/raw_vllm.py`). `--compare-raw` runs only this part;
  `--baseline-repo DIR` also serves lodestar from another checkout (e.g. a worktree of the commit before a
  change: before/after in one interleaved run), `--flush-ms 5 20` serves one variant per `--stream-flush-ms`
  value and `--variant 'LABEL=FLAGS'` one with any server flags; `--scale K` makes every phase K times longer
  (less noise); `--spread-lengths` gives requests 64-191 sampled tokens instead of 128 each, on both sides (a
  round of C requests then ends at different engine steps, not all at one); the table gives each ratio's
  per-repeat range (one start order) or both orders' ratios. Each lodestar server is driven two ways: a
  `Generate` call per generation (what any gRPC client does) and the gateway's own client, generations as tags
  of one `GenerateMany` stream (`--no-many`: the first only, for a checkout that predates GenerateMany).
  `--floor` also serves bench/grpc_floor.py, the gRPC transport over lodestar's vLLM engine with none of
  lodestar's layers (driven with `Generate` calls): floor / raw is what the transport costs, lodestar / floor
  what lodestar's own layers cost.

  **The engine started later runs faster** on the 2-core development machine, in every arrangement tried (the
  figures: docs/benchmarks.md, "Figures moved from module docstrings"; the cause is not known). So by default
  (`--raw-start both`) the comparison runs twice, raw vLLM's engine started after the
  lodestar servers and then before them, and each ratio is the geometric mean of the two runs' (the two are shown in
  brackets); `--raw-start after|before` runs one order only. Several lodestar servers in one run are ordered too
  (`--baseline-repo` starts first, then this checkout, then each `--variant`): measure a change twice with its
  servers' start order swapped.

Every figure is the median of `--repeats` runs. `--write-docs` replaces this script's own section of
docs/benchmarks.md (heading `SECTION`) with the tables, or appends it; the raw-vLLM comparison goes on top of
the `RAW_SECTION` of bench/results/inference-vs-raw-vllm.md, earlier runs below it (the history of the ratio;
docs/benchmarks.md keeps the current figures, by hand).
Usage: `.venv/bin/python bench/inference.py [--backends transformers] [--compare-raw] [--write-docs]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NEW_TOKENS = 128
FLOOR = "floor (gRPC + engine)"
"""The label of bench/grpc_floor.py's server in the raw-vLLM table (`--floor`)."""
NOTES = """
- Logprob capture: the transformers engine computes the processed log-softmax to sample anyway, so "off"
  only skips copying one float per token (the difference is noise); vLLM skips its logprob gather.
- TTFT ~8K: every repeat uses a fresh prompt (no prefix-cache hit). Prefill is not chunked on either
  backend: a long prefill holds the engine, and the transformers engine pauses the batch's decoding while
  it runs.
- Through the server, c=16 is below the engine-level figure: every token is one gRPC message on each of
  16 streams, and the benchmark client shares the same 2 cores.
- The 2 cores are shared with other work, so absolute numbers move by +-30% between runs.
"""
SECTION = "## Inference: transformers vs vLLM through the server (bench/inference.py)"
RAW_SECTION = "## Inference: lodestar Generate vs raw vLLM (bench/inference.py)"
KV_CACHE_BYTES = 512 * 1024**2


def user(text: str) -> Any:
    from lodestar.v1 import common_pb2

    return common_pb2.ChatMessage(
        role=common_pb2.ROLE_USER, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))]
    )


async def one_call(stub: Any, text: str, seed: int, max_tokens: int) -> tuple[int, float]:
    """(tokens generated, seconds to the first delta) of one streaming Generate."""
    from lodestar.v1 import common_pb2, inference_pb2

    request = inference_pb2.GenerateRequest(
        messages=[user(text)], stream=True, sampling=common_pb2.SamplingParams(seed=seed, max_tokens=max_tokens)
    )
    started = time.perf_counter()
    first = None
    tokens = 0
    async for response in stub.Generate(request, timeout=600):
        if response.WhichOneof("event") == "delta":
            first = first if first is not None else time.perf_counter() - started
        else:
            tokens = len(response.final.completion_token_ids)
    return tokens, first or 0.0


async def server_figures(address: str, repeats: int) -> dict[str, float]:
    import grpc.aio

    from lodestar.v1 import inference_pb2_grpc

    figures: dict[str, list[float]] = {"tps_c1": [], "tps_c16": [], "ttft_short_ms": [], "ttft_8k_ms": []}
    long_prompt = "def handler(event, context):\n    return process(event)\n" * 500
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 1 << 28)]) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await one_call(stub, "warm up", 0, 8)
        for repeat in range(repeats):
            started = time.perf_counter()
            tokens, _ = await one_call(stub, "Write a long story.", repeat, NEW_TOKENS)
            figures["tps_c1"].append(tokens / (time.perf_counter() - started))
            started = time.perf_counter()
            results = await asyncio.gather(
                *(one_call(stub, f"Story {i}.", 100 * repeat + i, NEW_TOKENS) for i in range(16))
            )
            figures["tps_c16"].append(sum(t for t, _ in results) / (time.perf_counter() - started))
            figures["ttft_short_ms"].append(
                (await one_call(stub, "Hello there, how are you today?", repeat, 1))[1] * 1e3
            )
            unique = f"# module {repeat} of run {time.time_ns()}\n" + long_prompt  # no prefix-cache hit
            figures["ttft_8k_ms"].append((await one_call(stub, unique, repeat, 1))[1] * 1e3)
    return {name: statistics.median(values) for name, values in figures.items()}


async def engine_figures(backend: str, model_dir: Path, repeats: int) -> dict[str, float]:
    from lodestar_inference import engines
    from lodestar_inference.engine import EngineRequest, SamplingOptions
    from lodestar_inference.settings import InferenceSettings

    fields = {"backend": backend, "model": model_dir, "kv_cache_bytes": 512 * 1024**2}
    settings = InferenceSettings.model_validate(fields)  # (backend: a string from the command line, checked here)
    engine = engines.create(settings)
    await engine.start()

    async def run(i: int, logprobs: bool) -> int:
        request = EngineRequest(
            f"b{i}", (5, 6, 7, 8 + i), SamplingOptions(max_tokens=NEW_TOKENS, seed=i), return_logprobs=logprobs
        )
        return sum([len(step.token_ids) async for step in engine.generate(request)])

    figures: dict[str, list[float]] = {"tps_c16_logprobs_on": [], "tps_c16_logprobs_off": []}
    try:
        await asyncio.gather(*(run(i, True) for i in range(4)))
        for repeat in range(repeats):
            for logprobs in (True, False) if repeat % 2 == 0 else (False, True):  # no order advantage
                started = time.perf_counter()
                tokens = sum(await asyncio.gather(*(run(i, logprobs) for i in range(16))))
                key = "tps_c16_logprobs_on" if logprobs else "tps_c16_logprobs_off"
                figures[key].append(tokens / (time.perf_counter() - started))
    finally:
        await engine.close()
    return {name: statistics.median(values) for name, values in figures.items()}


def measure_backend(backend: str, model_dir: Path, repeats: int) -> dict[str, float]:
    from bench.inference_servers import PYTHONS, serve_inference

    extra = ["--max-new-tokens", "4096", "--kv-cache-bytes", str(KV_CACHE_BYTES)]
    with tempfile.TemporaryDirectory() as logs, serve_inference(backend, model_dir, Path(logs), *extra) as server:
        figures = asyncio.run(server_figures(server.address, repeats))
    command = [
        str(PYTHONS[backend]),
        str(Path(__file__).resolve()),
        "--engine-only",
        backend,
        "--model",
        str(model_dir),
        "--repeats",
        str(repeats),
    ]
    engine = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=True)
    figures.update(json.loads(engine.stdout.strip().splitlines()[-1]))
    return figures


def measure_raw(
    model_dir: Path,
    repeats: int,
    variants: dict[str, tuple[Path, list[str]]],
    scale: int = 1,
    concurrency: tuple[int, ...] | None = None,
    many: bool = True,
    spread: bool = False,
    raw_first: bool = False,
    floor: bool = False,
) -> dict[str, dict[str, float]]:
    """lodestar (one vllm server per variant: label -> (checkout, extra server flags)) against raw vLLM,
    driven with a Generate call per generation and (`many`) over GenerateMany streams. Raw vLLM's engine
    starts after the servers' (`raw_first`: before them; the start order matters, see the module docstring).
    `floor`: also bench/grpc_floor.py's server (gRPC and the engine only; `Generate` calls), started between
    the lodestar servers and raw vLLM, so that its order to the servers flips with raw vLLM's."""
    from bench.grpc_floor import serve_floor
    from bench.inference_servers import serve_inference
    from bench.raw_vllm import RawVllm, compare

    async def run(logs: Path) -> dict[str, dict[str, float]]:
        raw = await RawVllm.start(model_dir, KV_CACHE_BYTES) if raw_first else None
        try:
            with contextlib.ExitStack() as servers:  # (a blocking start: nothing else runs on this loop yet)
                addresses = {}
                if floor and raw_first:
                    addresses[FLOOR] = servers.enter_context(serve_floor(model_dir, logs, KV_CACHE_BYTES))
                for label, (repo, flags) in variants.items():
                    extra = ["--max-new-tokens", "4096", "--kv-cache-bytes", str(KV_CACHE_BYTES), *flags]
                    server = servers.enter_context(serve_inference("vllm", model_dir, logs, *extra, repo=repo))
                    addresses[label] = (server.address, server.process.pid)
                if floor and not raw_first:
                    addresses[FLOOR] = servers.enter_context(serve_floor(model_dir, logs, KV_CACHE_BYTES))
                cells = {"concurrency": concurrency} if concurrency else {}
                return await compare(
                    addresses,
                    model_dir,
                    repeats,
                    KV_CACHE_BYTES,
                    scale,
                    many=many,
                    calls_only=frozenset({FLOOR}),
                    spread=spread,
                    raw=raw,
                    **cells,
                )
        finally:  # also when a server failed to start after raw vLLM's engine did
            if raw is not None:
                await raw.close()

    with tempfile.TemporaryDirectory() as logs:
        return asyncio.run(run(Path(logs)))


def table(results: dict[str, dict[str, float]]) -> str:
    header = (
        "| backend | tok/s c=1 | tok/s c=16 | TTFT ~30-token prompt | TTFT ~8K-token prompt "
        "| engine tok/s c=16, logprobs on | off | capture cost |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for backend, f in results.items():
        cost = 1 - f["tps_c16_logprobs_on"] / f["tps_c16_logprobs_off"]
        lines.append(
            f"| {backend} | {f['tps_c1']:.0f} | {f['tps_c16']:.0f} "
            f"| {f['ttft_short_ms']:.0f} ms | {f['ttft_8k_ms']:.0f} ms "
            f"| {f['tps_c16_logprobs_on']:.0f} | {f['tps_c16_logprobs_off']:.0f} | {cost:+.1%} |"
        )
    return "\n".join(lines)


def write_docs(text: str, repeats: int) -> None:
    section = (
        f"{SECTION}\n\n`bench/inference.py` on the tiny model (Qwen3, hidden 64, 2 layers, 4096 vocab, fp32 CPU), "
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, medians of {repeats} runs; "
        f"{NEW_TOKENS} new tokens per request, streaming over gRPC to a `lodestar inference serve` subprocess "
        "(columns 2-5); engine-level, in process (columns 6-8).\n\n"
        f"{text}\n{NOTES}"
    )
    from bench.docs_section import replace_section

    replace_section(SECTION, section)


def write_raw_docs(
    text: str, repeats: int, load: tuple[float, float], scale: int, spread: bool = False, raw_start: str = "both"
) -> None:
    """The new table on top of the raw-vLLM section; earlier tables stay below it (the history)."""
    from bench.docs_section import RAW_VLLM_LOG, replace_section
    from bench.raw_vllm import NEW_TOKENS as RAW_TOKENS
    from bench.raw_vllm import ROUNDS

    doc = RAW_VLLM_LOG.read_text() if RAW_VLLM_LOG.exists() else ""
    start = doc.find(RAW_SECTION + "\n")
    history = ""
    if start >= 0:
        end = doc.find("\n## ", start + len(RAW_SECTION))
        old = doc[start : end if end >= 0 else len(doc)]
        history = old[old.find("\n### ") + 1 :] if "\n### " in old else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = (
        f"{RAW_SECTION}\n\nThe same workload on raw vLLM (`AsyncLLM` in process, lodestar's engine arguments and "
        f"sampling parameters) and through `lodestar inference serve --backend vllm` over gRPC (client in the "
        f"benchmark process): a ~33-token prompt, {RAW_TOKENS} sampled tokens, seeded, logprobs on; C closed-loop "
        f"workers x {ROUNDS} requests each (times the run's scale); raw and lodestar phases back to back in "
        f"alternating order (since 2026-12-02 11:31 UTC: a seeded random order; since 12:54 UTC two runs, raw "
        f"vLLM's engine started after and before the lodestar server, each ratio the geometric mean of the two: "
        f"the engine started later runs faster, see that run), medians of the repeats, ratio = median of the "
        f"per-repeat lodestar/raw ratios (in brackets: the lowest and highest of them, where recorded). Newest "
        f"first.\n\n"
        f"### {when} (load average {load[0]:.1f} before, {load[1]:.1f} after; {repeats} repeats, scale {scale}"
        f"{'; spread lengths: 64-191 sampled tokens per request' if spread else ''}"
        f"; {'two runs, raw vLLM started after and before' if raw_start == 'both' else 'raw vLLM started ' + raw_start}"
        " the servers)"
        f"\n\n{text}\n\n{history}"
    )
    replace_section(RAW_SECTION, section.rstrip() + "\n\n", RAW_VLLM_LOG)  # a blank line before the next section


def parser() -> argparse.ArgumentParser:
    """The command line: which backends, how many repeats, and the raw-vLLM comparison's variants and cells."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backends", nargs="*", default=None, help="default: transformers, and vllm when .venv-vllm exists"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    parser.add_argument("--engine-only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compare-raw", action="store_true", help="only lodestar vs raw vLLM (vllm backend)")
    parser.add_argument("--baseline-repo", type=Path, default=None, help="also serve lodestar from this checkout")
    parser.add_argument("--flush-ms", type=float, nargs="*", default=[], help="variants with these stream_flush_ms")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="also serve this checkout with these server flags, e.g. 'budget 500=--stream-messages-per-s 500'",
    )
    parser.add_argument("--scale", type=int, default=1, help="requests per worker x this (longer phases)")
    parser.add_argument("--concurrency", type=int, nargs="*", default=None, help="raw-vLLM cells (default 1 16 64)")
    parser.add_argument(
        "--no-many", action="store_true", help="drive lodestar with Generate calls only (servers without GenerateMany)"
    )
    parser.add_argument(
        "--raw-start",
        choices=["both", "after", "before"],
        default="both",
        help="raw vLLM's engine starts after the lodestar servers, before them, or both: one run each, and every "
        "ratio the geometric mean of the two (default; the start order biases a single run)",
    )
    parser.add_argument(
        "--spread-lengths",
        action="store_true",
        help="raw-vLLM cells: requests of 64-191 sampled tokens (mean 127.5) instead of 128 each, on both sides",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also serve bench/grpc_floor.py (gRPC and the vLLM engine, none of lodestar's layers; Generate calls)",
    )
    parser.add_argument("--write-docs", action="store_true")
    return parser


def variants_of(args: argparse.Namespace) -> dict[str, tuple[Path, list[str]]]:
    """The lodestar servers the raw-vLLM comparison serves: label -> (checkout, server flags)."""
    variants: dict[str, tuple[Path, list[str]]] = {}
    if args.baseline_repo is not None:
        variants[f"before ({_commit(args.baseline_repo)})"] = (args.baseline_repo.resolve(), [])
    for flush in args.flush_ms or [None]:
        label = _commit(REPO) + ("" if flush is None else f", flush {flush:g} ms")
        variants[label] = (REPO, [] if flush is None else ["--stream-flush-ms", str(flush)])
    for spec in args.variant:
        label, _, flags = spec.partition("=")
        variants[f"{_commit(REPO)}, {label}"] = (REPO, flags.split())
    return variants


def raw_runs(args: argparse.Namespace, model_dir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """The raw-vLLM comparison's cells, one run per start order (`--raw-start`)."""
    concurrency = tuple(args.concurrency) if args.concurrency else None
    variants = variants_of(args)
    return {
        order: measure_raw(
            model_dir,
            args.repeats,
            variants,
            args.scale,
            concurrency,
            not args.no_many,
            args.spread_lengths,
            raw_first=order == "before",
            floor=args.floor,
        )
        for order in (("after", "before") if args.raw_start == "both" else (args.raw_start,))
    }


def report_raw(
    args: argparse.Namespace, runs: dict[str, dict[str, dict[str, float]]], load: tuple[float, float]
) -> None:
    """Print the raw-vLLM tables (each order's, then the combined one) and write the docs when asked."""
    from bench.raw_vllm import both_orders
    from bench.raw_vllm import sides as raw_sides
    from bench.raw_vllm import table as raw_table

    raw_cells = both_orders(runs["after"], runs["before"]) if len(runs) == 2 else runs[args.raw_start]
    text = raw_table(raw_cells, raw_sides(raw_cells))
    if len(runs) == 2:  # each order's own table (per-repeat ranges) before the combined one
        for order, cells in runs.items():
            print(f"raw vLLM started {order} the lodestar servers:\n{raw_table(cells, raw_sides(cells))}")
    print(f"load average {load[0]:.1f} before, {load[1]:.1f} after\n{text}")
    if args.write_docs:
        write_raw_docs(text, args.repeats, load, args.scale, args.spread_lengths, args.raw_start)


def main() -> None:
    args = parser().parse_args()
    if args.engine_only:
        print(json.dumps(asyncio.run(engine_figures(args.engine_only, args.model, args.repeats))))
        return
    from bench.inference_servers import PYTHONS

    backends = [] if args.compare_raw else args.backends
    if backends is None:
        backends = ["transformers", *(["vllm"] if PYTHONS["vllm"].exists() else [])]
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, float]] = {}
    runs: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            from lodestar_inference.tiny_model import build

            model_dir = build(Path(scratch) / "tiny")
        for backend in backends:
            try:
                results[backend] = measure_backend(backend, model_dir, args.repeats)
            except Exception as error:  # report the other backends' figures anyway
                print(f"{backend}: benchmark failed: {error!r}", file=sys.stderr)
            else:
                print(backend, json.dumps(results[backend]), file=sys.stderr)
        if (args.compare_raw or "vllm" in backends) and PYTHONS["vllm"].exists():
            runs = raw_runs(args, model_dir)
    load = (load_before, os.getloadavg()[0])
    if results:
        text = table(results)
        print(text)
        if args.write_docs:
            write_docs(text, args.repeats)
    if runs:
        report_raw(args, runs, load)


def _commit(repo: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
    )
    return out.stdout.strip() + (" + working tree" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
