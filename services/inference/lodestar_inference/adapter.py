"""LoRA adapter updates on a replica: recognise one, validate it against the base model, merge it.

A trainer with `[trainer.lora]` pushes each policy version as the adapter alone (lodestar_trainer/lora.py):
for every adapted linear layer `<module>`, `<module>.lora_A.weight` (r x in) and `<module>.lora_B.weight`
(out x r, already multiplied by alpha / r). The replica keeps the base weights it loaded at start and serves
`<module>.weight = base + B @ A` (merged in fp32, cast to the serving dtype): every adapter is merged onto the
BASE, never onto the previous version, so a replica that missed versions serves the next one exactly, and
version N's adapter replaces version N-1's. Engines call `check_adapter` from `validate_weights` and
`merge_adapter` where they load an update; everything else of the update path is the full-weight one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lodestar.errors import InvalidArgumentError
from lodestar_inference.engine import TensorMeta
from lodestar_inference.weights import FLOAT_DTYPES

if TYPE_CHECKING:
    import torch

A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


def is_adapter(names: Sequence[str]) -> bool:
    """Whether an update's tensor names are an adapter (every name ends in .lora_A.weight / .lora_B.weight)."""
    return bool(names) and all(name.endswith((A_SUFFIX, B_SUFFIX)) for name in names)


def target_of(name: str) -> str:
    """The base weight an adapter tensor changes: `m.lora_A.weight` -> `m.weight`."""
    return name.removesuffix(A_SUFFIX).removesuffix(B_SUFFIX) + ".weight"


def check_adapter(expected: Mapping[str, TensorMeta], given: Sequence[TensorMeta]) -> None:
    """Refuse an adapter update that does not fit the base model (InvalidArgumentError): a tensor mixed with
    plain weights, an A without its B, an unknown module, shapes other than A (r x in), B (out x r)."""
    names = [meta.name for meta in given]
    if not is_adapter(names):
        mixed = [name for name in names if not name.endswith((A_SUFFIX, B_SUFFIX))][:3]
        raise InvalidArgumentError(f"a weight update mixes adapter tensors with plain weights ({mixed})")
    by_name = {meta.name: meta for meta in given}
    if len(by_name) != len(given):
        raise InvalidArgumentError("adapter update names a tensor twice")
    for meta in given:
        if meta.dtype not in FLOAT_DTYPES:
            raise InvalidArgumentError(f"adapter tensor {meta.name!r} has dtype {meta.dtype}")
        if not meta.name.endswith(A_SUFFIX):
            continue
        partner = by_name.get(meta.name.removesuffix(A_SUFFIX) + B_SUFFIX)
        target = expected.get(target_of(meta.name))
        if partner is None:
            raise InvalidArgumentError(f"adapter tensor {meta.name!r} comes without its lora_B")
        if target is None or len(target.shape) != 2:
            raise InvalidArgumentError(f"adapter tensor {meta.name!r} adapts no linear weight of this model")
        out_features, in_features = target.shape
        rank = meta.shape[0] if len(meta.shape) == 2 else -1
        if tuple(meta.shape) != (rank, in_features) or tuple(partner.shape) != (out_features, rank):
            raise InvalidArgumentError(
                f"adapter for {target_of(meta.name)!r}: A {list(meta.shape)} and B {list(partner.shape)} do not fit "
                f"its weight {list(target.shape)}"
            )
    orphans = [
        name for name in names if name.endswith(B_SUFFIX) and name.removesuffix(B_SUFFIX) + A_SUFFIX not in by_name
    ]
    if orphans:
        raise InvalidArgumentError(f"adapter tensor {orphans[0]!r} comes without its lora_A")


def merge_adapter(base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The merged weight of every adapted module: `base[m.weight] + B @ A` in fp32, in the base's dtype and
    device. Only the adapted weights are returned (the rest stay the base's)."""
    import torch

    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, first in adapter.items():
            if not name.endswith(A_SUFFIX):
                continue
            second = adapter[name.removesuffix(A_SUFFIX) + B_SUFFIX]
            weight = base[target_of(name)]
            delta = second.to(weight.device, torch.float32) @ first.to(weight.device, torch.float32)
            merged[target_of(name)] = (weight.to(torch.float32) + delta).to(weight.dtype)
    return merged
