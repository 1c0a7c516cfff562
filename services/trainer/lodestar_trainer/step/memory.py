"""GPU memory of one training step, predicted from the model's shape: what fits before anything is allocated.

`step_memory(shape, tokens=..., ...)` is a pure function (no torch) that adds up, in bytes, what the trainer
holds at its two peaks (docs/gpu.md, "Memory" has the table for 135M-8B on one 80 GB GPU):

- the **backward peak** (end of a micro-batch's backward): the fp32 master weights, the bf16 compute copy
  (one process / DDP; step/precision.py) or FSDP2's gathered layer, the compute copy's gradients, the AdamW
  moments of earlier steps, and the activations of one micro-batch;
- the **optimizer peak** (`optimizer.step()`): master, compute copy, fp32 gradients, both AdamW moments (the
  first step allocates them) and the optimizer's temporaries: none for the fused kernel, one fp32 tensor of
  every parameter for torch's multi-tensor (`foreach`) path, the largest parameter for the per-tensor loop
  (step/adamw.py picks fused on CUDA).

Activations, with activation checkpointing: every decoder layer's input (tokens x hidden in the compute
dtype), one layer's recompute with its backward, and the chunked log-softmax's fp32 buffers (forward.py: the
target rows' hidden states and their gradient, one [row_chunk, vocab_chunk] logits tile and its softmax).
Without checkpointing every layer keeps what autograd saves for it (`layer_saved_bytes`: the Qwen/Llama layer
as transformers computes it: RMSNorm in fp32, Qwen3's q/k norms, the attention's q, k, v, output and logsumexp,
the MLP's four [tokens, intermediate] tensors; checked against autograd's saved tensors in tests/trainer/).
Not counted: the CUDA context and allocator slack (`reserve_gib` leaves room for them), and the flex kernels'
compile-time workspaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

GIB = 1024**3
OptimizerImpl = Literal["fused", "foreach", "for_loop"]


@dataclass(frozen=True)
class ModelShape:
    """The shape of a Llama/Qwen-family decoder (what a Hugging Face config says)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = True
    """Qwen3's per-head RMSNorm of q and k (two head_dim weights per layer)."""
    qkv_bias: bool = False
    """Qwen2's q, k, v projection biases."""

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """The shape of a transformers config object (Qwen2/Qwen3/Llama attribute names)."""
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab=int(config.vocab_size),
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qk_norm="qwen3" in str(getattr(config, "model_type", "")),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or getattr(config, "model_type", "") == "qwen2",
        )

    def layer_params(self) -> int:
        """Parameters of one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        bias = q + 2 * kv if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attention + bias + 3 * self.hidden * self.intermediate + norms

    def params(self) -> int:
        """All parameters, a tied head counted once."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params() + embeddings + self.hidden

    def largest_param(self) -> int:
        """Elements of the largest single parameter (the embedding matrix, for these models)."""
        return max(self.vocab * self.hidden, self.hidden * self.intermediate)

    def layer_saved_bytes(self, compute_bytes: int) -> int:
        """Bytes per token that autograd keeps for one decoder layer's backward (module docstring)."""
        c, h = compute_bytes, self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = 2 * (h * (4 + 2 * c) + 4)  # two RMSNorms: fp32 input, normalized, output; fp32 rsqrt per token
        qk_norm = (q + kv) * (4 + c) + (self.heads + self.kv_heads) * 4 if self.qk_norm else 0
        attention = 2 * q * c + 4 * kv * c + self.heads * 4  # rotated q, k, v, output, o_proj's input, lse
        mlp = 4 * self.intermediate * c  # gate, up, act(gate), act(gate) * up
        return norms + qk_norm + attention + mlp


@dataclass(frozen=True)
class StepMemory:
    """Predicted bytes by component, and the two peaks (module docstring)."""

    components: Mapping[str, int]
    backward_peak: int
    optimizer_peak: int

    @property
    def peak(self) -> int:
        return max(self.backward_peak, self.optimizer_peak)

    def fits(self, gpu_gib: float, reserve_gib: float = 2.0) -> bool:
        """Whether the peak fits `gpu_gib` with `reserve_gib` left for the CUDA context and allocator slack."""
        return self.peak <= (gpu_gib - reserve_gib) * GIB


def activation_bytes(
    shape: ModelShape,
    tokens: int,
    *,
    targets: int | None = None,
    compute_bytes: int = 2,
    checkpointing: bool = True,
    row_chunk: int = 4096,
    vocab_chunk: int = 8192,
) -> int:
    """Activation bytes of one micro-batch of `tokens` tokens with `targets` loss targets (default: all)."""
    targets = tokens if targets is None else targets
    per_layer = shape.layer_saved_bytes(compute_bytes) * tokens
    if checkpointing:
        layers = shape.layers * tokens * shape.hidden * compute_bytes + 2 * per_layer  # inputs; recompute + grads
    else:
        layers = shape.layers * per_layer + per_layer  # all layers, and one layer's gradients in flight
    head = 2 * targets * shape.hidden * 4 + 2 * min(targets, row_chunk) * vocab_chunk * 4
    return layers + head


def step_memory(
    shape: ModelShape,
    *,
    tokens: int,
    targets: int | None = None,
    compute_dtype: Literal["float32", "bfloat16"] = "bfloat16",
    checkpointing: bool = True,
    optimizer: OptimizerImpl = "fused",
    shards: int = 1,
) -> StepMemory:
    """Predicted memory of one step on one GPU with micro-batches of `tokens` tokens; `shards` > 1: FSDP2 over
    that many GPUs (weights, gradients and moments sharded; the compute-dtype layer gathered one at a time)."""
    params = shape.params()
    c = 2 if compute_dtype == "bfloat16" else 4
    master = params * 4 // shards
    if shards > 1:
        copy = 2 * shape.layer_params() * c  # the gathered layer and the next one (prefetch)
        copy_grads = 2 * shape.layer_params() * 4
    else:
        copy = params * c if c != 4 else 0
        copy_grads = params * c if c != 4 else 0
    grads = params * 4 // shards
    moments = 2 * params * 4 // shards
    temporaries = {"fused": 0, "foreach": params * 4 // shards, "for_loop": shape.largest_param() * 4}[optimizer]
    activations = activation_bytes(shape, tokens, targets=targets, compute_bytes=c, checkpointing=checkpointing)
    components = {
        "master weights (fp32)": master,
        "compute copy": copy,
        "gradients (fp32)": grads,
        "compute-copy gradients": copy_grads,
        "AdamW moments": moments,
        "optimizer temporaries": temporaries,
        "activations": activations,
    }
    # fp32 master gradients only exist after the backward; with fp32 compute they are the copy's gradients.
    backward_grads = copy_grads if copy_grads else grads
    backward = master + copy + backward_grads + moments + activations
    step = master + copy + grads + moments + temporaries
    return StepMemory(components, backward, step)


SHAPES: dict[str, ModelShape] = {
    "SmolLM2-135M": ModelShape(30, 576, 1536, 9, 3, 64, 49152, tied=True, qk_norm=False),
    "Qwen2.5-0.5B": ModelShape(24, 896, 4864, 14, 2, 64, 151936, tied=True, qk_norm=False, qkv_bias=True),
    "Qwen3-0.6B": ModelShape(28, 1024, 3072, 16, 8, 128, 151936, tied=True),
    "Qwen3-1.7B": ModelShape(28, 2048, 6144, 16, 8, 128, 151936, tied=True),
    "Qwen3-4B": ModelShape(36, 2560, 9728, 32, 8, 128, 151936, tied=True),
    "Qwen3-8B": ModelShape(36, 4096, 12288, 32, 8, 128, 151936, tied=False),
}
"""The released configs' shapes (the models docs/gpu.md's memory table is for)."""


H100_GIB = 79.6
"""What an "80 GB" H100 gives CUDA (81,559 MiB)."""


def _row(name: str, shape: ModelShape, tokens: int, gpu_gib: float, shards: int) -> str:
    fused = step_memory(shape, tokens=tokens, shards=shards)
    foreach = step_memory(shape, tokens=tokens, optimizer="foreach", shards=shards)
    part = fused.components
    verdict = ("yes" if fused.fits(gpu_gib) else "no") + ("" if foreach.fits(gpu_gib) else " (foreach: no)")
    keys = ("master weights (fp32)", "compute copy", "gradients (fp32)", "AdamW moments", "activations")
    cells = [
        name if shards == 1 else f"{name}, FSDP2 over {shards}",
        f"{shape.params() / 1e9:.2f}B",
        *(f"{part[key] / GIB:.1f}" for key in keys),
        f"{fused.peak / GIB:.1f}",
        f"{foreach.peak / GIB:.1f}",
        verdict,
    ]
    return "| " + " | ".join(cells) + " |"


def table(tokens: int = 16384, gpu_gib: float = H100_GIB) -> str:
    """docs/gpu.md's memory table, GiB per GPU: each of SHAPES on one GPU, and Qwen3-8B under FSDP2 (bf16 compute,
    activation checkpointing, micro-batches of `tokens`; the peak with fused AdamW and with torch's
    multi-tensor default; "fits": the fused peak within `gpu_gib` less 2 GiB for the CUDA context)."""
    rows = [
        "| model | params | master fp32 | bf16 copy | grads fp32 | AdamW moments | activations | peak, fused "
        "| peak, foreach | fits |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows += [_row(name, shape, tokens, gpu_gib, 1) for name, shape in SHAPES.items()]
    rows += [_row("Qwen3-8B", SHAPES["Qwen3-8B"], tokens, gpu_gib, shards) for shards in (2, 8)]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
