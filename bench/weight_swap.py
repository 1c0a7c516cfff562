"""Weight swaps with requests in flight: vLLM's no-drain swap (`weight_swap = "keep"`) against draining.

`python bench/weight_swap.py [--requests 8] [--tokens 1024] [--repeats 3]` (re-runs itself under
.venv-vllm). The tiny model, made unable to end a turn (a constant residual direction its end-of-turn rows
point away from), so every request runs to --tokens; one engine per mode, both started first and their
rounds alternating (the machine's load hits both alike). Per round: start --requests
streaming requests, wait until each has sampled 16 tokens, push an update of every q/k/v projection, and
measure
- swap: `update_weights` wall time, which is what the trainer's push waits for and how long a request
  arriving during the swap waits at most (drain: admission is closed for all of it; keep: vLLM is paused
  for the reload only);
- batch: from the first request's start until the last one finished, and the tokens per second over it
  (keep pays one re-prefill of every running request per swap; drain pays nothing extra here, but new
  requests could not start while it drained).
Medians over repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.vllm_venv import ensure_vllm  # noqa: E402


def build_model(directory: Path) -> dict[str, Any]:
    """The tiny model that cannot end a turn (saved to `directory`) and an update of its q/k/v weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from lodestar_inference.tiny_model import TinyModelSpec, build
    from lodestar_inference.tokenizer import TextTokenizer

    build(directory, TinyModelSpec(vocab_size=512, corpus_bytes=60_000, context_length=4096))
    weights = load_file(str(directory / "model.safetensors"))
    weights["model.embed_tokens.weight"][:, 0] += 0.3
    for eos in TextTokenizer.load(directory).eos_token_ids:
        weights["lm_head.weight"][eos, 0] = -30.0
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    scale = {"q_proj": 2.0, "k_proj": 4.0, "v_proj": 4.0}
    return {
        name: (tensor * factor).contiguous()
        for name, tensor in weights.items()
        for part, factor in scale.items()
        if part in name and tensor.dtype == torch.float32
    }


async def one_round(engine: Any, update: Any, requests: int, tokens: int) -> dict[str, float]:
    from lodestar_inference.engine import EngineRequest, SamplingOptions

    counts = [0] * requests
    started = time.perf_counter()

    async def consume(index: int) -> None:
        request = EngineRequest(f"r{index}", (1, 50 + index, 60, 70), SamplingOptions(max_tokens=tokens))
        async for step in engine.generate(request):
            counts[index] += len(step.token_ids)

    tasks = [asyncio.create_task(consume(i)) for i in range(requests)]
    while min(counts) < 16:  # noqa: ASYNC110 (every request is decoding when the swap comes)
        await asyncio.sleep(0.002)
    swap_started = time.perf_counter()
    await engine.update_weights(update)
    swap = time.perf_counter() - swap_started
    await asyncio.gather(*tasks)
    batch = time.perf_counter() - started
    return {"swap_ms": swap * 1e3, "batch_s": batch, "tokens_per_s": sum(counts) / batch}


async def measure(model_dir: Path, update_path: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Both modes' figures; their rounds alternate (keep, drain, keep, ...) so machine load hits both alike."""
    from lodestar_inference.engine import WeightUpdate
    from lodestar_inference.engines.vllm import create_engine
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.weights import read_checkpoint_meta

    modes = ("keep", "drain")
    engines = {}
    for mode in modes:
        settings = InferenceSettings(backend="vllm", model=model_dir, kv_cache_bytes=512 * 1024**2, weight_swap=mode)
        engines[mode] = create_engine(settings)
        await engines[mode].start()
    files, metas = read_checkpoint_meta(update_path)
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    try:
        for repeat in range(args.repeats):
            for mode in modes:
                update = WeightUpdate(update_path, tuple(metas), repeat + 1, tuple(files))
                rounds[mode].append(await one_round(engines[mode], update, args.requests, args.tokens))
    finally:
        for engine in engines.values():
            await engine.close()
    return {mode: {key: statistics.median(r[key] for r in rounds[mode]) for key in rounds[mode][0]} for mode in modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not ensure_vllm(__file__):
        return
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        update = build_model(scratch / "tiny")
        save_file(update, str(scratch / "update.safetensors"))
        figures = asyncio.run(measure(scratch / "tiny", scratch / "update.safetensors", args))
    rows = [
        f"| {mode} | {f['swap_ms']:.0f} ms | {f['batch_s']:.2f} s | {f['tokens_per_s']:.0f} |"
        for mode, f in figures.items()
    ]
    shape = f"{args.requests} streaming requests of {args.tokens} tokens"
    print(f"{shape}, one swap while they run (medians of {args.repeats})")
    print("| weight_swap | swap (push waits) | batch wall time | tok/s over the batch |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
