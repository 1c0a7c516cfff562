"""vLLM's own LoRA serving for the `vllm` engine (`vllm_lora = "native"`): one hot-loaded adapter per version.

With `vllm_lora = "native"` the engine starts vLLM with `enable_lora` and never touches the base weights: an
adapter push (lodestar_inference/adapter.py: `<module>.lora_A.weight`, `<module>.lora_B.weight` with B
already scaled by alpha / r) is written as a PEFT adapter directory (`adapter_model.safetensors` with peft's
`base_model.model.` names, `adapter_config.json` with `lora_alpha = r`, so vLLM's scaling is 1 and B is
applied as pushed), loaded with `AsyncLLM.add_lora` under a new `lora_int_id`, and from then on every new
request carries that version's `LoRARequest`. A request keeps the adapter it was admitted with to its end
(its policy version is the admitted one, no version spans), like the transformers engine; an adapter that is
no longer the newest is removed (`remove_lora`) and its directory deleted once its last request finished.

The prefix cache needs no reset: vLLM hashes a block with its request's LoRA name and path, and every
version gets its own. `max_loras` slots: the newest adapter plus older ones whose requests still run; a
request of a version without a free slot waits in vLLM's queue until one frees (running requests go on).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lodestar.errors import InternalError, InvalidArgumentError
from lodestar.logging import get_logger
from lodestar_inference.adapter import A_SUFFIX
from lodestar_inference.engine import WeightUpdate

if TYPE_CHECKING:
    import torch

log = get_logger("inference.vllm")

PEFT_PREFIX = "base_model.model."
"""What peft puts before a module's name in adapter_model.safetensors (vLLM strips it)."""
LORA_SLOTS = 3
"""vLLM's `max_loras`: the newest adapter and two older ones whose requests still run."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM accepts."""


def write_peft_adapter(adapter: Mapping[str, torch.Tensor], directory: Path, dtype: str) -> int:
    """Write a pushed adapter as a PEFT directory vLLM loads (module docstring); return its rank."""
    import torch
    from safetensors.torch import save_file

    ranks = {int(tensor.shape[0]) for name, tensor in adapter.items() if name.endswith(A_SUFFIX)}
    if len(ranks) != 1:
        raise InvalidArgumentError(f"adapter layers have different ranks {sorted(ranks)}; vLLM needs one")
    rank = ranks.pop()
    targets = sorted({name.removesuffix(A_SUFFIX).rsplit(".", 1)[-1] for name in adapter if name.endswith(A_SUFFIX)})
    directory.mkdir(parents=True)
    cast = getattr(torch, dtype)
    tensors = {f"{PEFT_PREFIX}{name}": tensor.to(cast).contiguous() for name, tensor in adapter.items()}
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets, "bias": "none"}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return rank


def _write_update(update: WeightUpdate, directory: Path, dtype: str) -> None:
    from safetensors import safe_open

    given: dict[str, Any] = {}
    for file in update.files or (update.path,):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                given[name] = handle.get_tensor(name)
    write_peft_adapter(given, directory, dtype)


@dataclass
class _Adapter:
    version: int
    request: Any
    """vLLM's LoRARequest."""
    directory: Path
    users: int = 0
    """Requests admitted with it that have not finished."""


class NativeAdapters:
    """Which adapter (LoRARequest) serves new requests, and which older ones are still in use."""

    def __init__(self, max_rank: int) -> None:
        self.max_rank = max_rank
        self._adapters: dict[int, _Adapter] = {}
        self._newest: _Adapter | None = None
        self._next_id = 1

    def check_rank(self, rank: int) -> None:
        """Refuse an adapter vLLM was not started for (InvalidArgumentError)."""
        if rank > self.max_rank:
            raise InvalidArgumentError(f"adapter rank {rank} exceeds vllm_lora_max_rank {self.max_rank}")

    async def push(self, llm: Any, update: WeightUpdate, directory: Path, dtype: str) -> None:
        """Write `update` (an adapter, validated) as a PEFT directory and hot-load it as its version's
        (InternalError when vLLM cannot: the previous adapter keeps serving)."""
        await asyncio.to_thread(_write_update, update, directory, dtype)
        try:
            await self.load(llm, update.version, directory)
        except Exception as error:
            shutil.rmtree(directory, ignore_errors=True)
            log.error("adapter load failed; the previous adapter keeps serving", error=str(error))
            raise InternalError("vLLM could not load the adapter; the previous one keeps serving") from error

    async def load(self, llm: Any, version: int, directory: Path) -> None:
        """Hot-load the adapter in `directory` as `version`'s: requests admitted from now on use it."""
        from vllm.lora.request import LoRARequest

        lora_id = self._next_id
        self._next_id += 1
        request = LoRARequest(f"policy-{version}-{lora_id}", lora_id, str(directory))
        await llm.add_lora(request)  # loads and activates it; raises if vLLM cannot
        previous = self._newest
        self._newest = self._adapters[lora_id] = _Adapter(version, request, directory)
        if previous is not None:
            await self._retire(llm, previous)

    def acquire(self) -> tuple[Any, int | None]:
        """The LoRARequest a request admitted now runs with (None: the base model) and its version."""
        adapter = self._newest
        if adapter is None:
            return None, None
        adapter.users += 1
        return adapter.request, adapter.version

    async def release(self, llm: Any, request: Any) -> None:
        """A request admitted with `request` finished: drop its adapter if it is unused and not the newest."""
        adapter = self._adapters.get(request.lora_int_id) if request is not None else None
        if adapter is not None:
            adapter.users -= 1
            await self._retire(llm, adapter)

    async def _retire(self, llm: Any, adapter: _Adapter) -> None:
        if adapter is self._newest or adapter.users > 0:
            return
        if self._adapters.pop(adapter.request.lora_int_id, None) is None:
            return  # retired already
        try:
            if llm is not None:
                await llm.remove_lora(adapter.request.lora_int_id)
        finally:
            shutil.rmtree(adapter.directory, ignore_errors=True)
