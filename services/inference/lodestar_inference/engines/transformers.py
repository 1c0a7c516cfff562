"""The transformers engine: continuous batching of concurrent requests on a PyTorch causal LM (CPU or GPU).

One scheduler task owns all model state. Each iteration it drops cancelled sequences, admits waiting
requests up to `max_batch_size` (prefilled one by one with `logits_to_keep=1`, then joined to the
left-padded batch KV cache), and decodes one token for every running sequence in one forward pass per
policy version. Forward passes run in a worker thread so the event loop keeps serving RPCs.

Streams are paced here (`EngineInfo.paces_steps`): a request with `hold_s` gets its first and its finishing
step at once and otherwise a step when one is due (`engine.next_delivery`: about one per `hold_s`, at
instants shared by the streams of the same pace), the ids sampled meanwhile held in the sequence, so its
consumer is woken once per delta, not once per token.

Weight updates load into a copy of the current model and publish it as a new version group: requests
already running keep decoding on the weights they started with (their group), new requests join the
new group, and an old group is freed when its last sequence ends. The cost is a second copy of the
weights while old requests finish.

A LoRA adapter update (lodestar_inference/adapter.py) is merged onto the base weights loaded at start, held
for the engine's life: the new version's model shares every other tensor with the base (no copy) and owns
only the adapted weights, so base + adapter N is served with one copy of the base in memory.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.logging import get_logger
from lodestar_inference.adapter import check_adapter, is_adapter, merge_adapter
from lodestar_inference.engine import (
    EngineFinishReason,
    EngineInfo,
    EngineRequest,
    EngineStep,
    TensorMeta,
    WeightUpdate,
    next_delivery,
)
from lodestar_inference.engines.kv_batch import PaddedBatch, new_cache
from lodestar_inference.sampling import processed_logprobs, sample
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.weights import check_tensors, in_memory

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_log = get_logger("inference.transformers")


@dataclass(eq=False)
class _Sequence:
    request: EngineRequest
    max_tokens: int
    generator: torch.Generator
    queue: asyncio.Queue[EngineStep | BaseException] = field(default_factory=asyncio.Queue)
    last_id: int = -1
    produced: int = 0
    cancelled: bool = False
    done: bool = False
    held_ids: list[int] = field(default_factory=list)
    """Ids sampled since the last delivered step (pacing: `request.hold_s`), with their logprobs."""
    held_logprobs: list[float] = field(default_factory=list)
    due: float = 0.0
    """When the next held step may be delivered (0: at once)."""

    def deliver(self, token: int, logprob: tuple[float, ...], version: int, finish: EngineFinishReason | None) -> None:
        """Hand one sampled id to the consumer: at once, or held until the next delivery is due (the first
        and the finishing step are never held)."""
        self.held_ids.append(token)
        self.held_logprobs += logprob
        now = time.perf_counter()
        if finish is None and now < self.due:
            return
        self.queue.put_nowait(EngineStep(tuple(self.held_ids), tuple(self.held_logprobs), version, finish))
        self.held_ids, self.held_logprobs = [], []
        if self.request.hold_s > 0:
            self.due = next_delivery(now, self.request.hold_s)


@dataclass(eq=False)
class _Group:
    """The sequences decoding on one policy version's weights."""

    version: int
    model: Any
    batch: PaddedBatch = field(default_factory=PaddedBatch)
    sequences: list[_Sequence] = field(default_factory=list)


class TransformersEngine:
    """See the module docstring; implements `lodestar_inference.engine.Engine`."""

    def __init__(self, model_dir: Path, *, device: str, dtype: str, max_batch_size: int) -> None:
        self._model_dir = model_dir
        self._device = torch.device(device)
        self._dtype = _DTYPES[dtype]
        self._max_batch = max_batch_size
        self._current: _Group | None = None
        self._groups: list[_Group] = []
        self._waiting: deque[_Sequence] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._info: EngineInfo | None = None
        self._expected: dict[str, TensorMeta] = {}
        self._base: dict[str, torch.nn.Parameter] = {}
        """The parameters loaded at start, which every adapter update is merged onto (and shares)."""

    async def start(self) -> None:
        eos = TextTokenizer.load(self._model_dir).eos_token_ids
        model = await asyncio.to_thread(self._load)
        config = model.config
        self._info = EngineInfo(
            backend="transformers",
            context_length=int(getattr(config, "max_position_embeddings", 0) or 0) or 4096,
            vocab_size=int(config.vocab_size),
            eos_token_ids=eos,
            paces_steps=True,
            dtype=str(self._dtype).removeprefix("torch."),
        )
        self._expected = {
            name: TensorMeta(name, tuple(tensor.shape), _SAFETENSORS_DTYPES.get(tensor.dtype, str(tensor.dtype)))
            for name, tensor in model.state_dict().items()
        }
        self._base = dict(model.named_parameters(remove_duplicate=False))
        self._current = _Group(version=0, model=model)
        self._groups = [self._current]
        self._task = asyncio.create_task(self._run(), name="transformers-scheduler")

    def _load(self) -> Any:
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        model: Any = AutoModelForCausalLM.from_pretrained(self._model_dir, dtype=self._dtype)
        return model.to(self._device).eval()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        closed = UnavailableError("the inference engine is shutting down")
        for group in self._groups:
            for sequence in group.sequences:
                sequence.queue.put_nowait(closed)
        for sequence in self._waiting:
            sequence.queue.put_nowait(closed)
        self._groups, self._waiting, self._current = [], deque(), None

    def info(self) -> EngineInfo:
        if self._info is None:
            raise UnavailableError("the inference engine is starting")
        return self._info

    @property
    def policy_version(self) -> int:
        return self._current.version if self._current is not None else 0

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        info = self.info()
        room = info.context_length - len(request.prompt_ids)
        if not request.prompt_ids:
            raise InvalidArgumentError("the prompt is empty")
        if room <= 0:
            raise InvalidArgumentError(
                f"the prompt has {len(request.prompt_ids)} tokens; the context length is {info.context_length}"
            )
        seed = request.sampling.seed if request.sampling.seed is not None else int.from_bytes(os.urandom(8), "little")
        generator = torch.Generator().manual_seed(seed % 2**63)
        sequence = _Sequence(request, min(request.sampling.max_tokens, room), generator)
        self._waiting.append(sequence)
        self._wake.set()
        try:
            while True:
                step, error = _merge_waiting(await sequence.queue.get(), sequence.queue)
                yield step
                if error is not None:
                    raise error
                if step.finish_reason is not None:
                    return
        finally:
            sequence.cancelled = True
            self._wake.set()

    # -- weights -------------------------------------------------------------------------------------

    def validate_weights(self, tensors: Sequence[TensorMeta]) -> None:
        if is_adapter([meta.name for meta in tensors]):
            check_adapter(self._expected, tensors)
        else:
            check_tensors(self._expected, tensors)

    async def update_weights(self, update: WeightUpdate) -> int:
        self.validate_weights(update.tensors)
        if self._current is None:
            raise UnavailableError("the inference engine is not running")
        base = self._current
        model = await asyncio.to_thread(self._load_update, base.model, update)
        group = _Group(version=update.version, model=model)
        # Only the scheduler removes groups (woken here, it frees the ones no sequence runs on): a request it
        # is prefilling joins the group that was current when its prefill began, after the swap if one lands
        # meanwhile, and that group must still be decoded then (dropped here, its request hung after one id).
        self._groups.append(group)
        self._current = group
        self._wake.set()
        _log.info("weights swapped", policy_version=update.version, tensors=len(update.tensors))
        return update.version

    def _load_update(self, base: Any, update: WeightUpdate) -> Any:
        """A copy of `base` with the update's tensors, each written once: the replaced parameters and buffers
        are made from the (memory-mapped) files and handed to the deep copy, which shares the rest with `base`
        (copying a tensor and then overwriting it took a second pass over every updated byte). Files held in
        memory (/dev/shm: a spooled stream or broadcast, a `shared_fs` version) are not copied at all when
        the dtype and device match: the parameters are the file's pages, mapped copy-on-write, shared by the
        replicas that load one `shared_fs` file and kept after the file is deleted."""
        files = update.files or (update.path,)
        copy_needed = not all(in_memory(file) for file in files)
        tensors: dict[str, torch.Tensor] = {}
        for file in files:
            tensors.update(load_file(str(file)))
        current = {**dict(base.named_parameters(remove_duplicate=False)), **dict(base.named_buffers())}
        memo: dict[int, Any] = {}
        if is_adapter(list(tensors)):  # the adapted weights merged onto the base; the rest ARE the base's
            tensors = merge_adapter(self._base, tensors)
            memo = {id(current[name]): kept for name, kept in self._base.items() if name not in tensors}
        with torch.no_grad():
            for name, tensor in tensors.items():
                old = current[name]
                new = tensor.to(device=old.device, dtype=old.dtype, copy=copy_needed)
                if isinstance(old, torch.nn.Parameter):
                    new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
                memo[id(old)] = new
        for kept in current.values():  # the tensors an update leaves are the previous version's, shared, not
            memo.setdefault(id(kept), kept)  # copied (no version writes its weights): a changed-only update is cheap
        model = copy.deepcopy(base, memo)
        return model.eval()

    # -- scheduler -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._reap() or self._waiting:
                await self._admit()
                self._reap()
                for group in list(self._groups):
                    if group.sequences:
                        await self._decode(group)
                self._free_idle_groups()
            self._free_idle_groups()  # a swap with nothing running (pushes between rollout batches)

    def _free_idle_groups(self) -> None:
        """Drop the old versions no sequence decodes on (their weights go with them)."""
        self._groups = [group for group in self._groups if group.sequences or group is self._current]

    def _running(self) -> int:
        return sum(len(group.sequences) for group in self._groups)

    def _reap(self) -> bool:
        """Drop finished/cancelled sequences; True while any sequence runs."""
        self._waiting = deque(sequence for sequence in self._waiting if not sequence.cancelled)
        for group in self._groups:
            keep = [row for row, sequence in enumerate(group.sequences) if not (sequence.cancelled or sequence.done)]
            if len(keep) != len(group.sequences):
                group.batch.keep(keep)
                group.sequences = [group.sequences[row] for row in keep]
        return self._running() > 0

    async def _admit(self) -> None:
        while self._waiting and self._running() < self._max_batch and self._current is not None:
            sequence = self._waiting.popleft()
            group = self._current
            try:
                cache, logits = await asyncio.to_thread(self._prefill, group.model, sequence.request.prompt_ids)
            except Exception as error:  # a broken request must not stop the scheduler
                _log.error("prefill failed", request_id=sequence.request.request_id, exc_info=error)
                sequence.queue.put_nowait(UnavailableError("generation failed (see server log)"))
                continue
            group.batch.join(cache, len(sequence.request.prompt_ids))
            group.sequences.append(sequence)
            self._emit(group, sequence, logits)

    async def _decode(self, group: _Group) -> None:
        try:
            logits = await asyncio.to_thread(self._decode_step, group)
        except Exception as error:
            _log.error("decode failed", version=group.version, exc_info=error)
            for sequence in group.sequences:
                sequence.queue.put_nowait(UnavailableError("generation failed (see server log)"))
                sequence.done = True
            return
        group.batch.advance()
        for row, sequence in enumerate(group.sequences):
            self._emit(group, sequence, logits[row])

    def _prefill(self, model: Any, prompt: tuple[int, ...]) -> tuple[Any, torch.Tensor]:
        ids = torch.tensor([prompt], dtype=torch.long, device=self._device)
        cache = new_cache(model.config)
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[0, -1].float().cpu()

    def _decode_step(self, group: _Group) -> torch.Tensor:
        ids = torch.tensor([[sequence.last_id] for sequence in group.sequences], device=self._device)
        mask, positions = group.batch.step_inputs(self._device)
        with torch.inference_mode():
            out = group.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=group.batch.cache,
                use_cache=True,
            )
        group.batch.cache = out.past_key_values
        logits: torch.Tensor = out.logits[:, -1].float().cpu()
        return logits

    def _emit(self, group: _Group, sequence: _Sequence, logits: torch.Tensor) -> None:
        """Sample one id for `sequence` from its next-token logits and deliver the step."""
        options = sequence.request.sampling
        logprobs = processed_logprobs(logits, options.temperature, options.top_k, options.top_p)
        token = sample(logprobs, options.temperature, sequence.generator)
        sequence.last_id = token
        sequence.produced += 1
        finish: EngineFinishReason | None = None
        if token in self.info().eos_token_ids:
            finish = "stop"
        elif sequence.produced >= sequence.max_tokens:
            finish = "length"
        sequence.done = finish is not None
        logprob = (float(logprobs[token]),) if sequence.request.return_logprobs else ()
        sequence.deliver(token, logprob, group.version, finish)


def _merge_waiting(
    item: EngineStep | BaseException, queue: asyncio.Queue[EngineStep | BaseException]
) -> tuple[EngineStep, BaseException | None]:
    """`item` plus every step already waiting behind it, as one step (a slow consumer gets bigger steps,
    not a backlog), and an error that was waiting behind them (raised after the step is delivered)."""
    if isinstance(item, BaseException):
        raise item
    if queue.empty() or item.finish_reason is not None:
        return item, None
    ids, logprobs, finish = list(item.token_ids), list(item.logprobs), item.finish_reason
    while finish is None and not queue.empty():
        waiting = queue.get_nowait()
        if isinstance(waiting, BaseException):
            return EngineStep(tuple(ids), tuple(logprobs), item.policy_version, finish), waiting
        ids += waiting.token_ids
        logprobs += waiting.logprobs
        finish = waiting.finish_reason
    return EngineStep(tuple(ids), tuple(logprobs), item.policy_version, finish), None


def create_engine(settings: InferenceSettings) -> TransformersEngine:
    if settings.model is None:
        raise InvalidArgumentError("the transformers backend needs --model DIR")
    return TransformersEngine(
        settings.model, device=settings.device, dtype=settings.serving_dtype(), max_batch_size=settings.max_batch_size
    )
