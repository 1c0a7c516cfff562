"""The trainer's AdamW: which of torch's implementations runs, chosen so the step's memory is known.

torch's AdamW has three implementations with the same arithmetic and different memory (step/memory.py):
the fused kernel (`fused=True`: one kernel per parameter group, no full-size temporary), the multi-tensor path
(`foreach`, torch's default on CUDA: one fp32 temporary the size of every parameter, 16 GB for a 4B model,
which alone takes a 4B step on one 80 GB GPU out of memory) and the per-tensor loop (the largest parameter's
size at a time; torch's default on CPU). The trainer runs the fused kernel on CUDA and the per-tensor loop
elsewhere. A resumed optimizer takes the implementation flags of its checkpoint's parameter groups (torch's
`load_state_dict` copies them), so `conform` sets them back after a load and moves the step counters where
the fused kernel keeps them (on the parameter's device, fp32).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from lodestar_trainer.step.memory import OptimizerImpl


def implementation(device: str) -> OptimizerImpl:
    """AdamW's implementation on `device`: "fused" on CUDA, "for_loop" elsewhere (module docstring)."""
    return "fused" if device.startswith("cuda") else "for_loop"


def _flags(impl: OptimizerImpl) -> dict[str, bool]:
    return {"fused": impl == "fused", "foreach": impl == "foreach"}


def adamw(params: Iterable[torch.Tensor], *, lr: float, weight_decay: float, impl: OptimizerImpl) -> torch.optim.AdamW:
    """torch's AdamW over `params` running `impl`."""
    flags = _flags(impl)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=flags["fused"], foreach=flags["foreach"])


def conform(optimizer: torch.optim.Optimizer, impl: OptimizerImpl) -> None:
    """Set every parameter group back to `impl` after `load_state_dict`, the step counters where it keeps them."""
    flags = _flags(impl)
    for group in optimizer.param_groups:
        group.update(flags)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and isinstance(state.get("step"), torch.Tensor):
                step = state["step"]
                state["step"] = step.to(device=param.device, dtype=torch.float32) if flags["fused"] else step.cpu()
