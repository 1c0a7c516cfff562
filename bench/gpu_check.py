"""The prepared GPU check: one run on one GPU answers what the CPU machines cannot, as one markdown table.

Rows, by section:
1. versions (Python, torch, CUDA, triton, transformers, lodestar's commit) and the device;
2. activation checkpointing gives the same loss and gradients as none (fp32, flex on CUDA); the three builders
   (per_request, prefix_merging, tree) give the same loss and every gradient to 1e-5 in
   fp32 through the real path (build -> pack -> target logprobs -> GRPO loss with KL -> backward), per
   attention backend; the same in bf16 compute, where the differences are reported, not judged;
3. tree attention against a dense masked SDPA in fp64 on the same inputs: outputs and gradients of the
   flex (FlexAttention, compiled) and explicit backends, fp32 and bf16, on a random tree and on packed
   documents (Qwen3's head shape: 16 query heads over 8 key/value heads of 128);
4. throughput of the trainer's step on random-weight Qwen3-shaped models (4B first, then 1.7B and 0.6B;
   vocabulary 151,936) in bf16 compute over fp32 master weights with activation checkpointing, flex
   attention and the trainer's AdamW (fused on CUDA), with a FAIL verdict when a loss, a gradient or a stepped
   weight is not finite, the peak memory next to step/memory.py's prediction: on
   bench/trainer.py's 19-call session shape at full length (16K system+tools prefix) for a group of
   `--group-size` sessions, and on one ~32K-token session, per builder: tokens/s, MFU, peak memory;
5. the transformers inference engine: sampled logprobs equal a teacher-forced recompute (fp32: to 1e-4;
   bf16: reported).

Section 4 times a sample of each builder's micro-batches (after one untimed pass on a micro-batch of the
same padded length, which compiles the flex kernels for it): tokens/s = tokens of the timed micro-batches /
their forward+backward seconds; MFU = model FLOPs of those micro-batches (6 x decoder-layer weights per
token, 12 x attention pairs x query heads x head size per layer, 6 x hidden x vocabulary per target; no
recompute counted) / seconds / the GPU's dense bf16 peak (989 TFLOP/s for H100/H200 SXM, else
`--peak-tflops`); peak memory = torch.cuda.max_memory_allocated over the builder's passes and one AdamW
step (model, master weights, optimizer state included); the micro-batch budget is the largest of 32,768 and
16,384 tokens that step/memory.py predicts to fit the GPU. Cases run in order until `--budget-s` has passed;
the rest are listed as skipped. Sections run 1, 4, 2, 3, 5: the 4B rows first (the ones a cut-short run must
not lose); the budget only ever cuts throughput cases. Before importing anything else the script checks the
packages lodestar's modules need (protobuf >= 7.35.1 among them) and exits naming the missing ones.

`--device cpu` runs every section on tiny shapes (explicit attention; flex forward only, since torch has no
flex backward on CPU) in well under a minute: tests/bench/test_gpu_check.py runs it in `make test`, so the
script cannot rot. Usage on the GPU machine: docs/gpu.md.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
NEEDS = {"protobuf": (7, 35, 1), "structlog": (0,), "pydantic": (2, 7), "rich": (0,), "transformers": (0,)}
"""What lodestar's modules import beyond torch, with the least version (lodestar/v1 needs protobuf >= 7.35.1)."""


def missing_packages() -> list[str]:
    """The packages of NEEDS absent or too old here, as pip requirement strings (checked before importing any)."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for name, least in NEEDS.items():
        try:
            have = tuple(int(part) for part in version(name).split(".")[:3] if part.isdigit())
        except PackageNotFoundError:
            have = ()
        if not have or have < least:
            missing.append(f"{name}>={'.'.join(map(str, least))}" if least != (0,) else name)
    return missing


if __name__ == "__main__" and (_missing := missing_packages()):
    sys.exit(
        f"gpu_check: missing or too old: {' '.join(_missing)}. Install them first, e.g. offline from wheels carried "
        f"along: pip install --no-index --find-links .whl/gpu {' '.join(repr(m) for m in _missing)} (docs/gpu.md)"
    )

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from bench.gpu_check_attention import attention_vs_dense  # noqa: E402
from bench.gpu_check_report import Check, guarded, table  # noqa: E402
from lodestar_trainer.builders import BuilderKind, build_sequences  # noqa: E402
from lodestar_trainer.data.pack import pack  # noqa: E402
from lodestar_trainer.data.synthetic import SMALL_SHAPE, SessionShape, synthetic_samples  # noqa: E402
from lodestar_trainer.model import enable_activation_checkpointing  # noqa: E402
from lodestar_trainer.step import adamw  # noqa: E402
from lodestar_trainer.step.flex import padded_length  # noqa: E402
from lodestar_trainer.step.forward import AttentionBackend, target_logprobs  # noqa: E402
from lodestar_trainer.step.loss import LossConfig, LossNormalizer, LossOutput, policy_loss  # noqa: E402
from lodestar_trainer.step.memory import GIB, ModelShape, step_memory  # noqa: E402
from lodestar_trainer.step.precision import ComputeCopy  # noqa: E402

TOLERANCE = 1e-5
"""Section 2: loss and every gradient element, fp32, builder vs per_request (tests/trainer/test_equivalence)."""
QWEN3 = {  # the released configs' shapes (hidden, intermediate, layers, query heads); 8 KV heads of 128
    "Qwen3-4B": (2560, 9728, 36, 32),  # first: the rows a short run must not lose
    "Qwen3-1.7B": (2048, 6144, 28, 16),
    "Qwen3-0.6B": (1024, 3072, 28, 16),
}
VOCAB = 151_936
CPU_VOCAB = 4_096
FULL_SHAPE = SessionShape(prefix_tokens=16_000, task_tokens=200, turns=(19, 19))
"""bench/trainer.py's session shape: 19 calls, tool results 100-2,000 tokens, replies 50-500 (~41K at the end)."""
SESSION_32K = replace(FULL_SHAPE, prefix_tokens=7_000)
"""The same 19 calls on a shorter prefix: one session that ends near 32K tokens."""
PEAKS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}
"""Dense bf16 peak FLOP/s by device-name substring (SXM parts)."""


# -- 1. versions --------------------------------------------------------------------------------------


def versions(check: Check) -> None:
    import transformers

    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        commit = ""
    triton = importlib.util.find_spec("triton")
    triton_version = __import__("triton").__version__ if triton else "absent"
    check.add(
        1,
        "versions",
        "measured",
        f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"triton {triton_version}, transformers {transformers.__version__}, lodestar {commit or 'unknown commit'}",
    )
    if check.cuda:
        props = torch.cuda.get_device_properties(check.device)
        device = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}, "
            f"{props.multi_processor_count} SMs"
        )
    else:
        device = f"CPU ({platform.machine()}, {torch.get_num_threads()} torch threads): reduced mode"
    split = importlib.util.find_spec("lodestar_trainer.data.split") is not None
    check.add(1, "device", "measured", f"{device}; sequence splitting {'present' if split else 'absent'}")


# -- 2. builders equal --------------------------------------------------------------------------------


def tiny_qwen(vocab: int, *, head_dim: int = 64, layers: int = 2, seed: int = 0) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=65_536,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).float().train()


def builder_step(
    model: Any, reference: Any, kind: BuilderKind, attention: AttentionBackend, groups: int, size: int
) -> tuple[float, dict[str, torch.Tensor]]:
    """tests/trainer/test_equivalence.py's step: loss and gradients of `groups` groups of `size` sessions."""
    shape = replace(SMALL_SHAPE, logprob_range=(-6.0, -5.0))  # near a random 256-token model's own logprobs
    samples = [
        synthetic_samples(shape, group_size=size, seed=seed, group_id=f"g{seed}", first_sample_index=size * seed)
        for seed in range(groups)
    ]
    sequences = [sequence for group in samples for sequence in build_sequences(kind, group).sequences]
    batches = pack(sequences, 300)
    norm = LossNormalizer.of(batches)
    config = LossConfig(kl_coef=0.05)
    model.zero_grad(set_to_none=True)
    total: LossOutput | None = None
    for batch in batches:
        new = target_logprobs(model, batch, vocab_chunk=1000, attention=attention)
        with torch.no_grad():
            ref = target_logprobs(reference, batch, vocab_chunk=1000, attention=attention)
        out = policy_loss(new, batch, config, norm, ref_logprobs=ref)
        out.loss.backward()
        total = out if total is None else total.merge(out)
    assert total is not None
    grads = {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(total.loss), grads


def builders_equal(check: Check) -> None:
    model = tiny_qwen(SMALL_SHAPE.vocab_size).to(check.device)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    reference.requires_grad_(False)
    backends: list[AttentionBackend] = ["flex", "explicit"] if check.cuda else ["explicit"]
    if not check.cuda:
        check.add(2, "builders equal, fp32, flex", "skipped", "CPU: torch has no flex attention backward")
    fp32: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    groups = (2, 4) if check.cuda else (1, 3)  # CPU: fewer sessions, the same kinds of branches
    for attention in backends:
        results = {kind: builder_step(model, reference, kind, attention, *groups) for kind in BuilderKind}
        base_loss, base_grads = results[BuilderKind.PER_REQUEST]
        fp32[attention] = results[BuilderKind.PER_REQUEST]
        worst_loss = max(abs(loss - base_loss) for loss, _ in results.values())
        worst_grad = max(
            float((grads[name] - grad).abs().max())
            for _, grads in results.values()
            for name, grad in base_grads.items()
        )
        ok = worst_loss <= TOLERANCE and worst_grad <= TOLERANCE and len(base_grads) == len(list(model.parameters()))
        check.add(
            2,
            f"builders equal, fp32, {attention}",
            "pass" if ok else "FAIL",
            f"max |loss - per_request| {worst_loss:.1e}, max |grad - per_request| {worst_grad:.1e} over "
            f"{len(base_grads)} tensors (tolerance {TOLERANCE:g}); loss {base_loss:.6f}",
        )
    if len(fp32) == 2:
        (loss_a, grads_a), (loss_b, grads_b) = fp32["flex"], fp32["explicit"]
        across = max(float((grads_a[name] - grads_b[name]).abs().max()) for name in grads_a)
        ok = abs(loss_a - loss_b) <= TOLERANCE and across <= TOLERANCE
        check.add(2, "flex = explicit, fp32", "pass" if ok else "FAIL",
                  f"|loss diff| {abs(loss_a - loss_b):.1e}, max |grad diff| {across:.1e}")  # fmt: skip
    low, low_reference = copy.deepcopy(model).to(torch.bfloat16), reference.to(torch.bfloat16)
    attention = backends[0]
    results = {kind: builder_step(low, low_reference, kind, attention, *groups) for kind in BuilderKind}
    base_loss, base_grads = results[BuilderKind.PER_REQUEST]
    ref_loss, ref_grads = fp32[attention]

    def relative(grads: dict[str, torch.Tensor], against: dict[str, torch.Tensor]) -> float:
        return max(float((grads[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in against.items())

    between = ", ".join(
        f"{kind.value}: |loss diff| {abs(loss - base_loss):.1e}, grad rel. diff {relative(grads, base_grads):.1e}"
        for kind, (loss, grads) in results.items()
        if kind is not BuilderKind.PER_REQUEST
    )
    check.add(
        2,
        f"builders, bf16 compute, {attention}",
        "measured",
        f"vs bf16 per_request: {between}; bf16 per_request vs fp32: |loss diff| {abs(base_loss - ref_loss):.1e}, "
        f"grad rel. diff {relative(base_grads, ref_grads):.1e} (largest per-tensor ||diff|| / ||grad||)",
    )


def checkpointing_equal(check: Check) -> None:
    """Activation checkpointing recomputes each layer in the backward, the tree layout passed through to the
    attention again: the loss and every gradient element equal the ones without it (fp32), on flex on CUDA."""
    attention: AttentionBackend = "flex" if check.cuda else "explicit"
    model = tiny_qwen(SMALL_SHAPE.vocab_size).to(check.device)
    samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=1)
    batches = pack(build_sequences(BuilderKind.TREE, samples).sequences, 300)
    norm, config = LossNormalizer.of(batches), LossConfig()
    results = []
    for checkpointing in (False, True):
        net = copy.deepcopy(model)
        if checkpointing:
            enable_activation_checkpointing(net)
        total = 0.0
        for batch in batches:
            loss = policy_loss(target_logprobs(net, batch, vocab_chunk=1000, attention=attention), batch, config, norm)
            loss.loss.backward()
            total += float(loss.loss)
        results.append((total, {name: p.grad.detach().clone() for name, p in net.named_parameters()}))
    (plain_loss, plain), (ckpt_loss, ckpt) = results
    worst = max(float((ckpt[name] - grad).abs().max()) for name, grad in plain.items())
    finite = all(bool(grad.isfinite().all()) for grad in plain.values())
    ok = finite and abs(plain_loss - ckpt_loss) <= TOLERANCE and worst <= TOLERANCE
    check.add(
        2,
        f"activation checkpointing = none, fp32, {attention}",
        "pass" if ok else "FAIL",
        f"|loss diff| {abs(plain_loss - ckpt_loss):.1e}, max |grad diff| {worst:.1e} over {len(plain)} tensors "
        f"(tolerance {TOLERANCE:g}); {len(batches)} micro-batches of the tree builder; finite: {finite}",
    )


def builders_and_checkpointing(check: Check) -> None:
    checkpointing_equal(check)
    builders_equal(check)


# -- 5. the transformers inference engine --------------------------------------------------------------


def engine_logprobs(check: Check) -> None:
    from transformers import AutoModelForCausalLM

    from lodestar_inference.engine import EngineRequest, SamplingOptions
    from lodestar_inference.engines.transformers import TransformersEngine
    from lodestar_inference.sampling import processed_logprobs
    from lodestar_inference.tiny_model import TinyModelSpec, build

    model_dir = build(check.workdir / "tiny-model", TinyModelSpec(corpus_bytes=200_000))
    policies = [(1.0, 0, 1.0), (0.7, 50, 0.9), (1.0, 0, 1.0), (1.3, 20, 0.8)]
    rng = random.Random(3)
    prompts = [tuple(rng.randrange(5, 4000) for _ in range(20 + 37 * i)) for i in range(len(policies))]

    async def generate(engine: TransformersEngine) -> list[tuple[list[int], list[float]]]:
        async def one(index: int) -> tuple[list[int], list[float]]:
            temperature, top_k, top_p = policies[index]
            options = SamplingOptions(max_tokens=48, temperature=temperature, top_k=top_k, top_p=top_p, seed=index)
            ids: list[int] = []
            logprobs: list[float] = []
            async for step in engine.generate(EngineRequest(f"r{index}", prompts[index], options)):
                ids += step.token_ids
                logprobs += step.logprobs
            return ids, logprobs

        await engine.start()
        try:
            return list(await asyncio.gather(*(one(index) for index in range(len(policies)))))
        finally:
            await engine.close()

    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        engine = TransformersEngine(model_dir, device=str(check.device), dtype=dtype_name, max_batch_size=8)
        outputs = asyncio.run(generate(engine))
        teacher = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(check.device).eval()
        worst, tokens, outside = 0.0, 0, 0
        for (ids, logprobs), prompt, (temperature, top_k, top_p) in zip(outputs, prompts, policies, strict=True):
            with torch.no_grad():
                logits = teacher(torch.tensor([[*prompt, *ids]], device=check.device)).logits[0].float()
            rows = processed_logprobs(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)], temperature, top_k, top_p)
            expected = rows[torch.arange(len(ids)), torch.tensor(ids, device=check.device)].cpu()
            finite = torch.isfinite(expected)  # bf16: a token at the top-k/top-p edge may fall outside the recompute's
            outside += int((~finite).sum())
            worst = max(worst, float((expected[finite] - torch.tensor(logprobs)[finite]).abs().max()))
            tokens += len(ids)
        detail = (
            f"{len(policies)} concurrent requests, {tokens} sampled tokens (temperature/top-k/top-p mixes), "
            f"max |engine - teacher-forced| {worst:.1e} nats"
        )
        if dtype == torch.float32:
            ok = worst < 1e-4 and not outside
            detail += f", {outside} outside the recompute's top-k/top-p (tolerance 1e-4, none outside)"
            check.add(5, "engine logprobs = teacher forcing, fp32", "pass" if ok else "FAIL", detail)
        else:
            check.add(5, "engine logprobs vs teacher forcing, bf16", "measured",
                      detail + f" over the tokens inside the recompute's top-k/top-p; {outside} outside it "
                      "(incremental decode vs one pass: bf16 kernels differ by shape)")  # fmt: skip
        del engine, teacher


# -- 4. throughput --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dims:
    """What the FLOP count needs: weights per token in the decoder layers, attention width, LM head size."""

    layer_weights: int
    layers: int
    attention_width: int
    """Query heads x head size."""
    head: int
    """hidden x vocabulary."""

    @classmethod
    def of(cls, model: Any) -> Dims:
        config = model.config
        weights = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
        return cls(weights, config.num_hidden_layers, config.num_attention_heads * config.head_dim,
                   config.hidden_size * config.vocab_size)  # fmt: skip

    def flops(self, batch: Any) -> float:
        """Model FLOPs of one forward+backward of `batch` (no recompute): 3 x the forward's."""
        tokens = len(batch.token_ids)
        pairs = sum(batch.position_ids) + tokens  # each token sees its ancestors and itself (position = depth)
        forward = 2 * self.layer_weights * tokens + 4 * pairs * self.attention_width * self.layers
        return 3.0 * forward + 6.0 * self.head * len(batch.target_tokens)


def qwen3(name: str, device: torch.device) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if name not in QWEN3:  # the reduced mode: a small vocabulary too (bf16 on CPU is slow)
        return tiny_qwen(CPU_VOCAB, head_dim=32).to(device)
    hidden, intermediate, layers, heads = QWEN3[name]
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131_072,
        tie_word_embeddings=True,  # as the released 0.6B-4B (RoPE base and norm epsilon do not change the cost)
    )
    torch.manual_seed(0)
    with device:  # initialized on the GPU directly: seconds, not minutes, for 4B parameters
        model = Qwen3ForCausalLM(config)
    return model.float().train()


def throughput(check: Check) -> None:
    shapes = [(f"19-call sessions x{check.group_size}, full length", FULL_SHAPE, check.group_size),
              ("one ~32K-token session", SESSION_32K, 1)]  # fmt: skip
    budget = 32_768
    models = list(QWEN3) if check.cuda else ["tiny Qwen3 (hidden 64, 2 layers, vocabulary 4,096)"]
    if not check.cuda:  # the same path on the full shape's lengths cut 512-fold
        shapes = [(name, scaled(shape, 1 / 512), size) for name, shape, size in shapes[:1]]
        budget = 512
    peak = check.peak_tflops * 1e12 if check.peak_tflops else None
    if check.cuda and peak is None:
        name = torch.cuda.get_device_name(check.device)
        peak = next((value for key, value in PEAKS.items() if key in name), None)
    attention: AttentionBackend = "flex" if check.cuda else "explicit"
    for model_name in models:
        if check.elapsed() > check.budget_s:
            check.add(4, model_name, "skipped", f"time budget ({check.budget_s:.0f} s) spent")
            continue
        master = qwen3(model_name, check.device)
        enable_activation_checkpointing(master)
        compute = ComputeCopy(master, torch.bfloat16)
        impl = adamw.implementation(str(check.device))  # fused on CUDA: no full-size temporary (step/adamw.py)
        optimizer = adamw.adamw(master.parameters(), lr=1e-6, weight_decay=0.0, impl=impl)
        dims = Dims.of(master)
        if check.cuda:  # the largest budget the estimator says fits this GPU (step/memory.py)
            total = torch.cuda.get_device_properties(check.device).total_memory / GIB
            shape = ModelShape.of(master.config)
            budget = next((b for b in (32_768, 16_384) if step_memory(shape, tokens=b).fits(total, 4.0)), 8_192)
            check.predicted = step_memory(shape, tokens=budget).peak / GIB
        params = sum(p.numel() for p in master.parameters())
        for shape_name, shape, group_size in shapes:
            vocab = int(master.config.vocab_size)
            group = synthetic_samples(replace(shape, vocab_size=vocab), group_size=group_size, seed=0)
            for kind in BuilderKind:
                count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
                label = f"{model_name} ({count} parameters), {shape_name}, {kind.value}"
                if check.elapsed() > check.budget_s:
                    check.add(4, label, "skipped", f"time budget ({check.budget_s:.0f} s) spent")
                    continue
                sequences = build_sequences(kind, group).sequences
                try:
                    batches = pack(sequences, budget)
                    finite, detail = measure(check, compute, optimizer, dims, batches, budget, attention, peak)
                    check.add(4, label, "measured" if finite else "FAIL", detail)
                except torch.cuda.OutOfMemoryError as error:
                    longest = max(len(sequence) for sequence in sequences)
                    check.add(4, label, "error", f"out of memory (longest sequence {longest:,} tokens): {error}"[:300])
                finally:
                    compute.model.zero_grad(set_to_none=True)
                    optimizer.zero_grad(set_to_none=True)
        del master, compute, optimizer
        if check.cuda:
            torch.cuda.empty_cache()


def scaled(shape: SessionShape, factor: float) -> SessionShape:
    def span(pair: tuple[int, int]) -> tuple[int, int]:
        return max(1, round(pair[0] * factor)), max(1, round(pair[1] * factor))

    return replace(
        shape,
        prefix_tokens=round(shape.prefix_tokens * factor),
        task_tokens=max(1, round(shape.task_tokens * factor)),
        tool_result_tokens=span(shape.tool_result_tokens),
        reply_tokens=span(shape.reply_tokens),
    )


def measure(
    check: Check,
    compute: ComputeCopy,
    optimizer: torch.optim.Optimizer,
    dims: Dims,
    batches: list[Any],
    budget: int,
    attention: AttentionBackend,
    peak: float | None,
) -> tuple[bool, str]:
    """Untimed pass on the longest micro-batch, timed passes on up to `check.sample` others of its padded
    length (or on it again), one optimizer step; whether every loss, gradient and stepped weight is finite, and
    the figures as a table cell."""
    norm, config = LossNormalizer.of(batches), LossConfig()
    ordered = sorted(batches, key=lambda batch: len(batch.token_ids), reverse=True)
    warm, bucket = ordered[0], padded_length(len(ordered[0].token_ids))
    timed = [b for b in ordered[1:] if padded_length(len(b.token_ids)) == bucket][: check.sample] or [warm]
    if check.cuda:
        torch.cuda.reset_peak_memory_stats(check.device)

    losses: list[torch.Tensor] = []

    def run(batch: Any) -> None:
        new = target_logprobs(compute.model, batch, attention=attention)
        loss = policy_loss(new, batch, config, norm).loss
        loss.backward()
        losses.append(loss.detach())

    started = time.perf_counter()
    run(warm)
    check.sync()
    warm_s = time.perf_counter() - started
    started = time.perf_counter()
    for batch in timed:
        run(batch)
    check.sync()
    seconds = time.perf_counter() - started
    compute.grads_to_master()
    grads_finite = all(bool(p.grad.isfinite().all()) for p in compute.master.parameters() if p.grad is not None)
    started = time.perf_counter()
    optimizer.step()
    compute.weights_from_master()
    check.sync()
    step_s = time.perf_counter() - started
    finite = {
        "loss": all(bool(loss.isfinite()) for loss in losses),
        "gradients": grads_finite,
        "weights after AdamW": all(bool(p.isfinite().all()) for p in compute.master.parameters()),
    }
    bad = [name for name, ok in finite.items() if not ok]
    tokens = sum(len(batch.token_ids) for batch in timed)
    all_tokens = sum(len(batch.token_ids) for batch in batches)
    rate = tokens / seconds
    flops = sum(dims.flops(batch) for batch in timed)
    mfu = f"{100 * flops / seconds / peak:.1f}%" if peak else "n/a (unknown peak)"
    memory = f"{torch.cuda.max_memory_allocated(check.device) / 2**30:.1f} GiB" if check.cuda else "n/a on CPU"
    if check.cuda and check.predicted:
        memory += f" (predicted {check.predicted:.1f})"
    over = sum(len(batch.token_ids) > budget for batch in batches)
    verdict = f"NON-FINITE {', '.join(bad)}; " if bad else "loss, gradients and weights finite; "
    return not bad, verdict + (
        f"{rate:,.0f} tokens/s, MFU {mfu}, peak {memory}; step ~{all_tokens / rate + step_s:.0f} s for "
        f"{all_tokens:,} tokens in {len(batches)} micro-batches ({over} over the {budget:,}-token budget), timed "
        f"{len(timed)} ({tokens:,} tokens, {seconds:.1f} s) after a {warm_s:.1f} s first pass; AdamW {step_s:.1f} s"
    )


# -- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (reduced: tiny shapes)")
    parser.add_argument("--out", type=Path, help="write the markdown table here too (rewritten after every row)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no throughput case after this")
    parser.add_argument("--group-size", type=int, default=2, help="sessions per group in section 4's full shape")
    parser.add_argument("--sample", type=int, help="timed micro-batches per builder in section 4 (2; CPU: 1)")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU (default: by name)")
    parser.add_argument("--sections", default="1,4,2,3,5", help="which sections, in this order")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sample = args.sample or (2 if device.type == "cuda" else 1)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (use --device cpu for the reduced mode)")
    console = Console(stderr=True)
    sections: dict[str, tuple[str, Callable[[Check], None]]] = {
        "1": ("versions", versions),
        "2": ("builders equal", builders_and_checkpointing),
        "3": ("attention vs dense", attention_vs_dense),
        "4": ("throughput", throughput),
        "5": ("engine logprobs", engine_logprobs),
    }
    order = [part.strip() for part in args.sections.split(",") if part.strip()]
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, Progress(*columns, console=console) as progress:
        check = Check(device, args.budget_s, args.out, console, Path(tmp), args.group_size, sample,
                      args.peak_tflops)  # fmt: skip
        task = progress.add_task("gpu check", total=len(order))
        for key in order:
            name, run = sections[key]
            progress.update(task, description=f"section {key}: {name}")
            guarded(check, int(key), name, lambda run=run: run(check))  # type: ignore[misc]
            progress.advance(task)
    text = table(check.rows)
    print(text)
    console.log(f"done in {check.elapsed():.0f} s")
    return 1 if any(row.result in ("FAIL", "error") for row in check.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
