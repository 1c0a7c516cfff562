"""Keep the garbage collector off a server's startup heap.

A model server holds millions of long-lived objects after startup (modules, the tokenizer, the engine's
state). Every collection of the oldest generation walks all of them, and serving allocates enough small
objects (responses, deltas, engine outputs) to trigger one every few seconds (what that cost the vLLM
inference server: docs/benchmarks.md, "Figures moved from module docstrings"). `freeze_startup_heap()` after
startup moves what exists then out of the collector's sight (`gc.freeze`), as `vllm serve` does after its
own startup; objects allocated later are collected as usual.
"""

from __future__ import annotations

import gc

from lodestar.logging import get_logger

_log = get_logger("heap")


def freeze_startup_heap() -> int:
    """Collect once, then freeze every surviving object (logged); returns how many were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    _log.info("startup heap frozen", objects=frozen)
    return frozen
