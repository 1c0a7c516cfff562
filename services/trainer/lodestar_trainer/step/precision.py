"""Mixed precision: bf16 compute with fp32 master weights, so small updates are not rounded away.

A pure-bf16 AdamW step loses any update below half a bf16 ulp of the weight (8 significant bits: a weight
of 0.01 moves in steps of ~6e-5), so with RL learning rates (~1e-6) most updates would vanish silently.
`--dtype bfloat16` therefore keeps the trained model (optimizer, checkpoints, pushed weights) in fp32:

- one process (and `--parallel ddp`): `ComputeCopy` holds a bf16 copy of the model for the forward and
  backward passes; after the backward its gradients move to the fp32 master (as fp32), the optimizer
  steps the master, and the master's weights are cast back into the copy;
- FSDP2: `fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))` on the
  fp32 model does the same inside FSDP (see distributed.py).

The log-softmax and the loss are fp32 in every case (forward.py, loss.py).

TF32 on CUDA (`set_matmul_precision`): with bf16 compute the fp32 matmuls left are the LM head's (forward.py
upcasts the hidden states and the head to fp32 for the log-softmax), and their operands are bf16 values, which
TF32's 10-bit mantissa holds exactly: TF32 gives the fp32 result (fp32 accumulation) at tensor-core speed.
(The one fp32 operand is an untied head under FSDP2, kept replicated in fp32: TF32 rounds it to 2^-11, finer
than the bf16 rounding of everything else in that step.) With fp32 compute the user asked for fp32
arithmetic, so matmuls stay full fp32 (torch's `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1` turns TF32 on anyway).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch


class ComputeCopy:
    """A low-precision copy of `master` for forward/backward; grads flow back, weights flow forward."""

    def __init__(self, master: Any, dtype: torch.dtype) -> None:
        self.master = master
        self.model: Any = copy.deepcopy(master).to(dtype)
        self._pairs = list(zip(master.parameters(), self.model.parameters(), strict=True))

    def grads_to_master(self) -> None:
        """Move the copy's gradients onto the master parameters as fp32 (accumulating onto none)."""
        for master, low in self._pairs:
            master.grad = None if low.grad is None else low.grad.to(master.dtype)
            low.grad = None

    @torch.no_grad()
    def weights_from_master(self) -> None:
        """Cast the master's (just stepped) weights into the copy."""
        for master, low in self._pairs:
            low.copy_(master)


def fp32_matmul_precision(device: str, compute_dtype: torch.dtype) -> Literal["highest", "high"]:
    """torch's float32 matmul precision for training on `device` in `compute_dtype`: "high" (TF32) on CUDA
    with bf16 compute, where it is lossless (module docstring), else "highest" (full fp32)."""
    return "high" if device.startswith("cuda") and compute_dtype == torch.bfloat16 else "highest"


def set_matmul_precision(device: str, compute_dtype: torch.dtype) -> None:
    """Apply `fp32_matmul_precision` (process-wide; CPU matmuls are left as torch has them)."""
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision(fp32_matmul_precision(device, compute_dtype))
