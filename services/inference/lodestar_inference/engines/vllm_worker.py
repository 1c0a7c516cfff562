"""The vLLM worker extension of the `vllm` engine: runs inside vLLM's engine-core worker process.

vLLM mixes `WorkerExtension` into its worker (`worker_extension_cls`), and the engine calls its methods
through `AsyncLLM.collective_rpc` (only strings, numbers and paths cross that boundary on the CPU build).
`lodestar_reload` streams one safetensors file through vLLM's layerwise in-place `reload_weights`,
redoes the CPU gemm dispatch of the embeddings (tied lm_head), and on a failure half-way puts every
layer still on the meta device back on its previous tensors so the engine survives. Imported only by
vLLM (by name), never by the server process except for that name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

_QUIET = ("layerwise", "inplace")
"""vLLM reload modules whose warnings are noise for a partial update."""


class WorkerExtension:
    """Methods vLLM adds to its worker; called through `AsyncLLM.collective_rpc` (self is the worker)."""

    model_runner: Any

    def lodestar_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused layers: packed module name -> checkpoint module names (q,k,v -> qkv_proj)."""
        model = self.model_runner.get_model()
        return {key: list(value) for key, value in getattr(model, "packed_modules_mapping", {}).items()}

    def lodestar_reload(self, path: str) -> int:
        """Reload the tensors of one safetensors file in place; return how many were loaded."""
        from safetensors import safe_open
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
        from vllm.platforms import current_platform

        count = 0

        def tensors() -> Iterator[tuple[str, Any]]:
            nonlocal count
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    count += 1
                    yield name, handle.get_tensor(name)

        worker: Any = self
        model = self.model_runner.get_model()
        # A partial update leaves most layers untouched on purpose; vLLM warns "Failed to load weights" for
        # each of them and lists them as "not loaded from checkpoint". Quiet those two loggers meanwhile.
        quiet = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{name}") for name in _QUIET]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        try:
            worker.reload_weights(weights_iterator=tensors())
        except Exception:
            _abandon_reload(model, self.model_runner.vllm_config.model_config)
            raise
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
            if current_platform.is_cpu():
                # The CPU build computes logits with a gemm prepared from the embedding weights at load
                # time; with tied embeddings a reload leaves it on the old values unless prepared again.
                from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

                for module in model.modules():
                    if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
                        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
        return count


def _abandon_reload(model: Any, model_config: Any) -> None:
    """After a reload failed half-way: put every layer not fully reloaded back on its kernel tensors.

    vLLM's layerwise reload moves each layer to the meta device until all its weights arrived; an
    exception leaves those layers there and the next forward pass kills the engine. Dropping their
    buffered loads and finalizing restores their previous tensors (layers already reloaded keep the new
    values: the caller then reloads the current weights in full).
    """
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO, finalize_layerwise_reload

    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is not None and info.can_load():
            info.loaded_weights = []
            info.load_numel = 0
    finalize_layerwise_reload(model, model_config)
