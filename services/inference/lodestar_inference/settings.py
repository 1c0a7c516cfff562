"""Settings of the inference service (`lodestar inference serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from lodestar.settings import EtcdClientSettings


class InferenceSettings(EtcdClientSettings):
    section = "inference"

    port: int = 50051
    backend: Literal["transformers", "vllm", "scripted"] = "transformers"
    """Engine: transformers (embedded default, CPU or GPU), vllm (AsyncLLM) or scripted (tests/replay)."""
    model: Path | None = None
    """Model directory (config, weights, tokenizer with chat template)."""
    model_name: str | None = None
    """Name reported to clients; defaults to the model directory's name."""
    replica_id: str = ""
    """This replica's name in every call it generates (`GenerateFinal.served_by`, `CallRecord.inference_replica`);
    default: hostname:port."""
    etcd: str | None = None
    """etcd endpoint to register this replica in (https://host:port with --etcd-tls-*, or http://host:port on
    loopback): gateways and the trainer started with `--inference-discovery etcd` find it there (its address,
    id and served policy version, under <etcd_prefix>inference/<replica_id>); without it nothing registers."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys."""
    etcd_lease_ttl_s: int = Field(default=10, ge=1)
    """TTL of the replica's etcd lease: a replica that dies vanishes from discovery after it (one that drains
    on SIGTERM leaves at once)."""
    advertise_address: str = ""
    """The host:port gateways and the trainer dial, as registered in etcd; default: --host:port, or the
    machine's hostname:port when --host is a wildcard (0.0.0.0, ::). In Kubernetes: the pod IP and port."""
    script: Path | None = None
    """Scripted backend: JSON file of replies, one per turn."""
    max_new_tokens: int = 4096
    """Server-side cap on new tokens per call (a request asking for more gets the cap)."""
    stream_flush_ms: float = 20.0
    """Streaming Generate: after the first delta (sent at once), a stream sends at most one delta per this
    many milliseconds, carrying every token sampled since its previous delta; 0 = one delta per engine step.
    20 ms (50 updates/s) cost 20-45% less front-end CPU per token than 5 ms (docs/benchmarks.md)."""
    stream_messages_per_s: float = 500.0
    """All streaming Generate calls together send about this many deltas per second at most: with n streams
    running, a new stream's interval is n / this many seconds rounded up to a multiple of stream_flush_ms
    when that is longer than stream_flush_ms (16 streams: 40 ms, 64 streams: 140 ms; paced streams come due
    at shared instants, so GenerateMany sends their deltas together). A gRPC message costs ~50 us of server
    CPU and as much in the client whatever it carries, on the cores the engine needs; 500 instead of 1000 cut
    the front-end CPU per streamed token by ~25% at 16 and 64 streams (docs/benchmarks.md); 0 = no budget
    (stream_flush_ms only)."""
    max_batch_size: int = 16
    """Transformers backend: most sequences decoded together."""
    device: str = "cpu"
    """Transformers backend: torch device ("cpu", "cuda", "cuda:1")."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Serving dtype; unset: bfloat16 on a CUDA device (`device` cuda..., or vLLM on a CUDA platform), float32
    on CPU (where bf16 is slow and fp32 keeps trainer and inference logprobs within ~1e-6)."""
    kv_cache_bytes: int = Field(default=0, ge=0)
    """vLLM backend: KV cache size in bytes; 0: on CUDA sized by `gpu_memory_utilization`, on CPU 2 GiB."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """vLLM on CUDA with kv_cache_bytes 0: the share of the GPU's memory vLLM may take (weights, activations
    and the KV cache in what is left)."""
    max_model_len: int = Field(default=0, ge=0)
    """vLLM backend: longest prompt + completion in tokens (bounds the KV cache a sequence may need); 0: the
    model's context length (config.json)."""
    max_num_seqs: int = Field(default=0, ge=0)
    """vLLM backend: most sequences scheduled at once; 0: vLLM's default."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM backend: GPUs one replica shards its model over."""
    enforce_eager: bool | None = None
    """vLLM backend: no CUDA graphs; unset: eager on CPU (no graphs there), graphs on CUDA."""
    prefix_caching: bool = True
    """vLLM on CUDA: reuse the KV blocks of a prompt's cached prefix (the cache is reset at every weight
    update, so no block computed under an older policy version is reused); on CPU vLLM's own default."""
    weight_swap: Literal["keep", "drain"] = "keep"
    """vLLM backend, how a weight update meets running requests. keep: they are frozen at a token boundary,
    the weights swapped under them, and they continue on the new version (their tokens' versions are
    recorded per range: `policy_version_spans`); the swap waits for no request. drain: new requests wait
    while every running one finishes on the old weights; a swap waits for the longest of them. Both reset
    the prefix cache. The transformers backend always keeps old requests on their old weights."""
    vllm_lora: Literal["merge", "native"] = "merge"
    """vLLM backend, how a LoRA adapter push (the trainer's `[trainer.lora]`) is served. merge: merged onto the
    base weights and reloaded like a full update (`weight_swap` applies). native: vLLM's own LoRA serving
    (`enable_lora`): each version's adapter is hot-loaded (`add_lora`) and new requests run with it, while a
    request keeps the adapter it started with (no spans); full-weight updates are refused."""
    vllm_lora_max_rank: int = Field(default=16, ge=1, le=512)
    """vLLM backend with `vllm_lora = "native"`: the largest adapter rank accepted (vLLM reserves room for it
    at start, rounded up to a rank it supports: 8, 16, 32, 64, ...)."""

    def serving_dtype(self, cuda: bool | None = None) -> Literal["float32", "bfloat16", "float16"]:
        """The dtype to serve in: `dtype`, or when unset bfloat16 on CUDA (`cuda`, default: `device` names a
        CUDA device) and float32 elsewhere."""
        if self.dtype is not None:
            return self.dtype
        on_cuda = self.device.startswith("cuda") if cuda is None else cuda
        return "bfloat16" if on_cuda else "float32"

    tool_call_format: Literal["auto", "hermes", "qwen3_coder"] = "auto"
    """How the model writes tool calls; auto reads it from the chat template (XML `<function=` or hermes)."""
    weights_spool_dir: Path | None = None
    """Where streamed weight updates are written before the swap (default: /dev/shm when writable, else TMPDIR)."""
    max_weights_bytes: int = Field(default=0, ge=0)
    """Largest streamed weight update (its header's total_bytes) accepted and spooled; larger ones are refused
    with INVALID_ARGUMENT before a byte is written. 0: twice the size of the model's safetensors files plus
    64 MiB (the trainer pushes fp32 master weights: twice a bf16 checkpoint)."""
    checkpoint_dirs: list[Path] = Field(default_factory=list)
    """Directories an UpdateWeights `checkpoint_path` may name (it must resolve, symlinks followed, to one of
    them or below); empty (the default): every checkpoint_path update is refused with PERMISSION_DENIED and
    only streamed updates are accepted (what the trainer sends)."""
    max_receive_message_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """Largest request message: a Generate request carries what a gateway accepted (its max_body_bytes, 32 MiB
    by default) plus token ids; an UpdateWeights chunk is 4 MiB."""


SETTINGS = InferenceSettings
