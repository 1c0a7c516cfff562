"""bench/gpu_check.py's section 3: tree attention (the flex and explicit backends) against a dense masked SDPA
in fp64 on the same inputs, outputs and gradients, on a random tree and on packed documents."""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F

from bench.gpu_check_report import Check
from lodestar_trainer.step.attention import TreeLayout
from lodestar_trainer.step.flex import FlexLayout
from lodestar_trainer.step.forward import AttentionBackend


def random_forest(size: int, seed: int) -> list[int]:
    """Parents of a random pre-order forest shaped like merged sessions: long chains that now and then (every
    ~300 tokens) branch off a uniformly drawn earlier token of the current path; a new root rarely."""
    rng = random.Random(seed)
    parents: list[int] = []
    path: list[int] = []
    for token in range(size):
        if path and rng.random() < 0.998:
            if rng.random() < 1 / 300:
                del path[rng.randrange(len(path)) + 1 :]
            parents.append(path[-1])
        else:
            path = []
            parents.append(-1)
        path.append(token)
    return parents


def packed_documents(lengths: list[int]) -> list[int]:
    parents: list[int] = []
    for length in lengths:
        start = len(parents)
        parents += [-1, *range(start, start + length - 1)]
    return parents


def dense_mask(parents: list[int], device: torch.device) -> torch.Tensor:
    """[T, T] bool: q sees k iff k is q or an ancestor of q, from `parents` alone (not from the code under test):
    the reflexive-transitive closure of the parent relation by repeated squaring, on the device."""
    size = len(parents)
    reach = torch.eye(size, device=device)
    children = torch.tensor([q for q, p in enumerate(parents) if p >= 0], dtype=torch.int64, device=device)
    reach[children, torch.tensor([p for p in parents if p >= 0], dtype=torch.int64, device=device)] = 1.0
    for _ in range(max(1, (size - 1).bit_length())):
        reach = (reach @ reach > 0).float()  # 0/1 entries and sums <= T: exact in fp32
    return reach > 0


def attention_case(
    check: Check, parents: list[int], name: str, heads: tuple[int, int, int], backend: AttentionBackend, dtype: Any
) -> None:
    size, (hq, hkv, dim) = len(parents), heads
    torch.manual_seed(0)
    magnitude = 3.0 if dtype == torch.bfloat16 else 1.0  # bf16: peaky softmaxes, where bf16 statistics would show
    inputs = [
        (scale * torch.randn(1, h, size, dim, device=check.device)).to(dtype)
        for h, scale in ((hq, magnitude), (hkv, magnitude), (hkv, 1.0))
    ]
    grad_out = torch.randn(1, hq, size, dim, device=check.device).to(dtype)
    leaves = [tensor.double().requires_grad_() for tensor in inputs]
    want = F.scaled_dot_product_attention(*leaves, attn_mask=dense_mask(parents, check.device), enable_gqa=True)
    want_grads = torch.autograd.grad(want, leaves, grad_out.double())
    backward = check.cuda or backend == "explicit"
    tensors = [tensor.clone().requires_grad_(backward) for tensor in inputs]
    with torch.set_grad_enabled(backward):
        layout = (
            FlexLayout.of(parents, device=check.device)
            if backend == "flex"
            else TreeLayout.of(parents, device=check.device)
        )
        out = layout.attend(*tensors, None)
        grads = torch.autograd.grad(out, tensors, grad_out) if backward else ()
    names = ["out", "dq", "dk", "dv"][: 1 + len(grads)]
    errors = {}
    ok = True
    for label, got, expected in zip(names, (out, *grads), (want, *want_grads), strict=False):
        got, expected = got.detach().double(), expected.detach()
        errors[label] = float((got - expected).norm() / expected.norm())
        if dtype == torch.float32:
            ok &= bool(torch.allclose(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max())))
        elif backend == "explicit":  # fp32 block math: only the final cast to bf16 rounds
            ok &= bool(torch.allclose(got, expected, rtol=2**-8, atol=1e-5 * float(expected.abs().max())))
        else:  # flex casts the probability tile to bf16 for the PV product, as FlashAttention does
            ok &= errors[label] < 1e-2
    bound = "1e-4 rel." if dtype == torch.float32 else ("bf16 rounding" if backend == "explicit" else "1e-2 norm-rel.")
    note = "" if backward else " (forward only: no flex backward on CPU)"
    check.add(
        3,
        f"{backend} vs dense, {str(dtype).removeprefix('torch.')}, {name}",
        "pass" if ok else "FAIL",
        ", ".join(f"{label} {error:.1e}" for label, error in errors.items())
        + f" (||diff|| / ||ref||; bound {bound}){note}",
    )


def attention_vs_dense(check: Check) -> None:
    size = 4096 if check.cuda else 300
    heads = (16, 8, 128) if check.cuda else (4, 2, 64)
    layouts = {
        f"random tree of {size}": random_forest(size, seed=1),
        f"packed documents of {size}": packed_documents([size // 2 + 77, size // 4, size - size // 2 - 77 - size // 4]),
    }
    for backend in ("flex", "explicit"):
        for dtype in (torch.float32, torch.bfloat16):
            for name, parents in layouts.items():
                attention_case(check, parents, name, heads, backend, dtype)  # type: ignore[arg-type]
