"""Weights over a shared filesystem (`weights_transport = "shared_fs"`): write each version once, send a path.

When the trainer and the replicas see one filesystem (one machine, where /dev/shm is fastest; or a shared
volume), streaming the same bytes to every replica over gRPC is wasted work: the trainer writes the version
once, in the replicas' serving dtype, to `<weights_dir>/policy-v<version>.safetensors` (written to a
temporary name and renamed, so a replica never reads half a file), and sends every replica an
UpdateWeights with only that `checkpoint_path` and the version, all at once. Each replica must list the
directory in its `--checkpoint-dirs` (else it refuses with PERMISSION_DENIED, which stops training with
that hint). A version's file is deleted once the next version is served, so only the newest file is kept:
a replica has copied it in during the swap or, when it lies in memory (/dev/shm) and the dtype matches,
maps it (the transformers engine: the replicas share its pages, which live until the last replica drops
that version).

Changed-only (`publish_delta`, weights/changes.py): the changed tensors are written to
`policy-v<version>-from-v<base>.safetensors` and sent with the base; only when a replica refuses it (it
does not serve the base) is the full `policy-v<version>.safetensors` written too, for those replicas.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lodestar.logging import get_logger
from lodestar_trainer.weights.publish import PublishResult, StaleBaseError
from lodestar_trainer.weights.replica_set import Outcome, ReplicaSet, ReplicaSetPublisher, Targets, collect

if TYPE_CHECKING:
    from lodestar_trainer.weights.changes import Delta

_log = get_logger("trainer.publish")


class SharedFsPublisher(ReplicaSetPublisher):
    """Publisher of `weights_transport = "shared_fs"` (see the module docstring)."""

    def __init__(
        self,
        targets: Targets,
        directory: Path,
        *,
        timeout_s: float = 300.0,
        attempts: int = 3,
        backoff_s: float = 2.0,
        on_close: Callable[[], None] | None = None,
        writer: str = "",
    ) -> None:
        """`writer`: the identity every update carries (the trainer's run id)."""
        self.replicas = ReplicaSet(
            targets, timeout_s=timeout_s, attempts=attempts, backoff_s=backoff_s, on_close=on_close, writer=writer
        )
        self.directory = directory.resolve()
        self._previous: list[Path] = []

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
        """Write `state` as `version`'s file in the replicas' serving dtype, then make every replica load it."""
        started = time.perf_counter()
        path, size = self._write(state, version)
        request = self.replicas.update_request(version, checkpoint_path=str(path))
        futures = self.replicas.submit(
            self.replicas.call_update, self.replicas.targets(), request, version, size, started
        )
        result = self.replicas.settle(version, len(state), size, started, collect(futures))
        self._keep([path])
        _log.debug("weights published through the shared filesystem", policy_version=version, path=str(path))
        return result

    def publish_delta(self, delta: Delta) -> PublishResult:
        """Write the changed tensors once and send their path with the base; the replicas that refuse it get the
        full version's file (written only then)."""
        targets = self.replicas.targets()
        outcomes: dict[str, Outcome] = {}
        written: list[Path] = []
        size = 0
        if delta.base:
            path, size = self._write(delta.changed_state(), delta.version, f"-from-v{delta.base:06d}")
            written.append(path)
            request = self.replicas.update_request(delta.version, delta.base, checkpoint_path=str(path))
            call = self.replicas.call_update
            outcomes = collect(self.replicas.submit(call, targets, request, delta.version, size, delta.started))
        behind = [t for t in targets if t not in outcomes or isinstance(outcomes[t], StaleBaseError)]
        full_size = 0
        if behind:
            path, full_size = self._write(delta.state, delta.version)
            written.append(path)
            request = self.replicas.update_request(delta.version, checkpoint_path=str(path))
            call = self.replicas.call_update
            outcomes |= collect(self.replicas.submit(call, behind, request, delta.version, full_size, delta.started))
        tensors = len(delta.changed) if delta.base else len(delta.state)
        result = self.replicas.settle(delta.version, tensors, size or full_size, delta.started, outcomes)
        self._keep(written)
        full = tuple(behind) if delta.base else ()
        return PublishResult(
            result.policy_version, tensors, result.payload_bytes, result.seconds, result.attempts, full, full_size
        )

    def _keep(self, paths: list[Path]) -> None:
        """Delete the previous version's files (`paths` are this version's)."""
        for old in self._previous:
            if old not in paths:
                old.unlink(missing_ok=True)
        self._previous = paths

    def _write(self, state: Mapping[str, torch.Tensor], version: int, suffix: str = "") -> tuple[Path, int]:
        """`state` as `version`'s file (`suffix` after the version in its name), in the serving dtype (a Delta's
        tensors are in it already: no copy)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"policy-v{version:06d}{suffix}.safetensors"
        partial = path.with_suffix(f".partial-{os.getpid()}")
        size = write_safetensors(state, partial, self.payload_dtype())
        partial.replace(path)
        return path, size


SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(state: Mapping[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
    """Write `state` to `path` as one safetensors file, straight from each tensor's memory (a tensor is copied
    only to cast its floating point to `dtype` or to make it contiguous on the CPU); returns the file's size.
    `serialize` builds the same file as bytes in memory first, two copies of every byte: for a version that
    only goes to a file, that was most of the push (0.7 of 0.95 s for SmolLM2 here)."""
    tensors: dict[str, torch.Tensor] = {}
    header: dict[str, Any] = {}
    offset = 0
    for name, given in state.items():
        tensor = given.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.to("cpu").contiguous()
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        tensors[name] = tensor
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for tensor in tensors.values():
            if tensor.numel():
                handle.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return 8 + len(encoded) + offset
