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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2
from services.trainer.publish import PublishResult
from services.trainer.replica_set import ReplicaSet, ReplicaSetPublisher, Targets, collect

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
    ) -> None:
        self.replicas = ReplicaSet(
            targets, timeout_s=timeout_s, attempts=attempts, backoff_s=backoff_s, on_close=on_close
        )
        self.directory = directory.resolve()
        self._previous: Path | None = None

    def publish_payload(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        """Write `payload` as `version`'s file, then make every replica load it."""
        path = self._write(payload, version)
        request = inference_pb2.UpdateWeightsRequest(checkpoint_path=str(path), policy_version=version)
        futures = self.replicas.submit(
            self.replicas.call_update, self.replicas.targets(), request, version, len(payload), started
        )
        result = self.replicas.settle(version, tensors, len(payload), started, collect(futures))
        if self._previous is not None and self._previous != path:
            self._previous.unlink(missing_ok=True)
        self._previous = path
        _log.debug("weights published through the shared filesystem", policy_version=version, path=str(path))
        return result

    def _write(self, payload: bytes, version: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"policy-v{version:06d}.safetensors"
        partial = path.with_suffix(f".partial-{os.getpid()}")
        with partial.open("wb") as handle:
            handle.write(payload)
        partial.replace(path)
        return path
