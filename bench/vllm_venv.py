"""Benchmarks that need vLLM run under .venv-vllm: `make bench` runs every script with .venv's python."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ensure_vllm(script: str) -> bool:
    """Return True when vllm imports here; else re-execute `script` (with this process's arguments) under
    .venv-vllm's python, or return False (the caller skips) when there is no .venv-vllm."""
    if importlib.util.find_spec("vllm") is not None:
        return True
    vllm_python = REPO / ".venv-vllm" / "bin" / "python"
    if not vllm_python.exists():
        print(f"bench/{Path(script).name}: no .venv-vllm (make vllm-venv); skipped")
        return False
    os.execv(str(vllm_python), [str(vllm_python), script, *sys.argv[1:]])
