"""The publisher of `weights.transport`: "shared_fs" (shared_fs.py) or "broadcast" (broadcast.py) to the
replicas named by `targets`; "grpc" is publish.py's (the caller builds it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.settings import WeightsSettings
from lodestar_trainer.weights.broadcast import BroadcastPublisher
from lodestar_trainer.weights.replica_set import Targets
from lodestar_trainer.weights.shared_fs import SharedFsPublisher


def transport_publisher(
    settings: WeightsSettings,
    directory: Path,
    targets: Targets,
    on_close: Callable[[], None] | None = None,
    writer: str = "",
) -> SharedFsPublisher | BroadcastPublisher:
    """The shared_fs (writing into `directory`) or broadcast publisher of the `weights` settings, its updates by
    `writer` (the trainer's run id) (InvalidArgumentError for "grpc" or bad values)."""
    timeout_s, attempts = settings.push_timeout_s, settings.push_attempts
    if settings.transport == "shared_fs":
        return SharedFsPublisher(
            targets, directory, timeout_s=timeout_s, attempts=attempts, on_close=on_close, writer=writer
        )
    if settings.transport != "broadcast":
        raise InvalidArgumentError(f"weights.transport {settings.transport!r} has no transport publisher")
    if not settings.broadcast_timeout_s > 0 or settings.broadcast_bucket_mb < 1:
        raise InvalidArgumentError("weights.broadcast_timeout_s must be > 0 and weights.broadcast_bucket_mb >= 1")
    return BroadcastPublisher(
        targets,
        backend=settings.broadcast_backend,
        host=settings.broadcast_host,
        port=settings.broadcast_port,
        broadcast_timeout_s=settings.broadcast_timeout_s,
        bucket_bytes=settings.broadcast_bucket_mb * 1024 * 1024,
        timeout_s=timeout_s,
        attempts=attempts,
        on_close=on_close,
        writer=writer,
    )
