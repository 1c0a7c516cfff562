"""Every collective of lodestar_trainer/parallel/distributed.py gets its tensors on the rank's collective device (NCCL
refuses CPU tensors; a CPU tensor that reaches gloo on a GPU machine silently copies through the host), and
the TF32 choice of precision.py. A stand-in for torch.distributed records what each collective receives; the
collective device is `meta` for the ones that build tensors (so a tensor left on the CPU shows) and `cuda:1`
for those that only name a device (no GPU needed to name one). The list of collectives is read from the
module's source, so a new one without a case here fails the test."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest
import torch
import torch.distributed as dist

from lodestar_trainer.parallel import distributed
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.step.precision import fp32_matmul_precision

COLLECTIVES = {"all_reduce", "broadcast", "broadcast_object_list", "barrier", "all_gather", "all_gather_object",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "reduce",
               "all_to_all", "send", "recv"}  # fmt: skip


class Delivered(Exception):
    """Raised by the stand-in once it recorded a tensor (a meta tensor cannot be read back)."""


def methods_calling_collectives() -> set[str]:
    tree = ast.parse(inspect.getsource(distributed))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "dist"
                        and call.func.attr in COLLECTIVES):  # fmt: skip
                    found.add(node.name)
    return found


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []

    def all_reduce(tensor: torch.Tensor, op: Any = None) -> None:
        calls.append(("all_reduce", tensor.device))
        raise Delivered

    def broadcast_object_list(objects: list[Any], src: int = 0, device: Any = None) -> None:
        calls.append(("broadcast_object_list", device))

    def barrier(device_ids: list[int] | None = None) -> None:
        calls.append(("barrier", device_ids))

    for name, stand_in in (("all_reduce", all_reduce), ("broadcast_object_list", broadcast_object_list),
                           ("barrier", barrier)):  # fmt: skip
        monkeypatch.setattr(dist, name, stand_in)
    return calls


def test_every_collective_gets_the_collective_device(received: list[tuple[str, Any]]) -> None:
    on_meta = Parallel(rank=0, world=2, device="meta")
    covered = {}
    for name, call in (("sum", lambda: on_meta.sum([1.0, 2.0])), ("max", lambda: on_meta.max([1.0]))):
        with pytest.raises(Delivered):
            call()
        covered[name] = received.pop()
    model = torch.nn.Linear(3, 2)  # gradients on the CPU: the flat buffer must move to the collective device
    model(torch.ones(1, 3)).sum().backward()
    with pytest.raises(Delivered):
        on_meta.reduce_replicated_grads(model)
    covered["reduce_replicated_grads"] = received.pop()
    with pytest.raises(Delivered):
        on_meta.clip_grad_norm(model, 1.0)
    assert received.pop() == ("all_reduce", torch.device("meta"))
    on_gpu = Parallel(rank=0, world=2, device="cuda:1")
    assert on_gpu.broadcast("plan") == "plan"
    covered["broadcast"] = received.pop()
    on_gpu.barrier()
    covered["barrier"] = received.pop()
    Parallel(rank=0, world=2, device="cpu").barrier()  # gloo: no device ids
    assert received.pop() == ("barrier", None)

    assert set(covered) == methods_calling_collectives()
    assert covered == {
        "sum": ("all_reduce", torch.device("meta")),
        "max": ("all_reduce", torch.device("meta")),
        "reduce_replicated_grads": ("all_reduce", torch.device("meta")),
        "broadcast": ("broadcast_object_list", torch.device("cuda:1")),
        "barrier": ("barrier", [1]),
    }


def test_tf32_only_where_it_is_lossless() -> None:
    assert fp32_matmul_precision("cuda", torch.bfloat16) == "high"
    assert fp32_matmul_precision("cuda:1", torch.bfloat16) == "high"
    assert fp32_matmul_precision("cuda", torch.float32) == "highest"
    assert fp32_matmul_precision("cpu", torch.bfloat16) == "highest"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (TF32 tensor cores)")
def test_tf32_lm_head_matmul_equals_fp32_on_bf16_operands() -> None:
    from lodestar_trainer.step.forward import chunked_target_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(512, 1024, device="cuda").bfloat16()
    weight = (0.05 * torch.randn(32000, 1024, device="cuda")).bfloat16()
    targets = torch.randint(0, 32000, (512,), device="cuda")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        exact = chunked_target_logprobs(hidden, weight, targets)
        torch.set_float32_matmul_precision("high")
        tf32 = chunked_target_logprobs(hidden, weight, targets)
    finally:
        torch.set_float32_matmul_precision(before)
    assert float((tf32 - exact).abs().max()) < 1e-4  # bf16 operands are exact in TF32: only summation order
