"""Weight-update plumbing shared by the server and every engine: safetensors metadata and validation, and
the limits of an update stream (`UpdateLimits`: where a checkpoint_path may point, how much may be spooled).

`read_safetensors_meta` reads only the JSON header of a safetensors file (no tensor bytes, no torch), so
an update can be validated before anything is loaded. `check_tensors` compares an update against the
tensors a model expects: unknown names, shape mismatches and non-floating dtypes are refused.

A changed-only update (`base_version` set: the trainer's weights/changes.py) carries only the tensors that
changed since that version; `check_base` refuses it with FAILED_PRECONDITION unless the replica serves
exactly that version (it missed one, restarted, or took another), before any of its bytes are read and
again under the update lock, so a diff is never applied over weights it was not made against.

Versions only grow: `check_newer` refuses an update whose version is not newer than the served one, naming
the writer of each (`WeightsHeader.writer`: a trainer's run id), so the refused trainer's reason says whose
version stands in its way.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.paths import confined
from lodestar.v1 import inference_pb2
from lodestar_inference.engine import TensorMeta

FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
"""Dtypes an update may carry; they are cast to the serving dtype."""

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_UPLOAD_MARGIN_BYTES = 64 * 1024 * 1024


def read_safetensors_meta(path: Path) -> list[TensorMeta]:
    """The tensors of one safetensors file (InvalidArgumentError when it is not one)."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise InvalidArgumentError("weights payload is not a safetensors file (too short)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES:
                raise InvalidArgumentError("weights payload is not a safetensors file (bad header length)")
            raw = handle.read(header_len)
            handle.seek(0, 2)
            total = handle.tell()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read weights file {path.name}: {error.strerror}") from error
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidArgumentError("weights payload is not a safetensors file (bad header)") from error
    if not isinstance(header, dict):
        raise InvalidArgumentError("weights payload is not a safetensors file (bad header)")
    data_len = total - 8 - header_len
    metas: list[TensorMeta] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = tuple(int(dim) for dim in entry["shape"])
            dtype = str(entry["dtype"])
            start, end = (int(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidArgumentError(f"weights payload: bad safetensors entry for {name!r}") from error
        if not 0 <= start <= end <= data_len:
            raise InvalidArgumentError(f"weights payload is truncated (tensor {name!r} lies past the end)")
        metas.append(TensorMeta(name=name, shape=shape, dtype=dtype))
    return metas


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the file itself, or the `*.safetensors` in a directory."""
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise InvalidArgumentError(f"checkpoint directory {path.name} holds no .safetensors file")
        return files
    if path.is_file():
        return [path]
    raise InvalidArgumentError(f"checkpoint path {path} does not exist")


def read_checkpoint_meta(path: Path, roots: Sequence[Path] | None = None) -> tuple[list[Path], list[TensorMeta]]:
    """Files and tensor metadata of a safetensors file or checkpoint directory; with `roots`, every file must
    resolve under them before it is opened (a file of the directory may be a symlink out of it)."""
    files = safetensors_files(path)
    if roots is not None:
        files = [checkpoint_files(str(file), roots) for file in files]
    metas: list[TensorMeta] = []
    for file in files:
        metas.extend(read_safetensors_meta(file))
    return files, metas


def check_tensors(expected: Mapping[str, TensorMeta], given: Sequence[TensorMeta]) -> None:
    """Refuse an update with unknown names, wrong shapes, non-float dtypes, duplicates or no tensors."""
    if not given:
        raise InvalidArgumentError("weight update carries no tensors")
    seen: set[str] = set()
    for meta in given:
        if meta.name in seen:
            raise InvalidArgumentError(f"weight update names tensor {meta.name!r} twice")
        seen.add(meta.name)
        want = expected.get(meta.name)
        if want is None:
            raise InvalidArgumentError(f"weight update has unknown tensor {meta.name!r}")
        if tuple(meta.shape) != tuple(want.shape):
            raise InvalidArgumentError(
                f"weight update tensor {meta.name!r} has shape {list(meta.shape)}, expected {list(want.shape)}"
            )
        if meta.dtype not in FLOAT_DTYPES:
            raise InvalidArgumentError(
                f"weight update tensor {meta.name!r} has dtype {meta.dtype}, expected one of {sorted(FLOAT_DTYPES)}"
            )


@dataclass(frozen=True)
class UpdateLimits:
    """What an UpdateWeights stream may ask of the server: the directories a `checkpoint_path` may name, and
    the most bytes a streamed update may spool."""

    checkpoint_dirs: tuple[Path, ...] = ()
    max_bytes: int = 0


def upload_limit(model: Path | None, configured: int) -> int:
    """The largest streamed update accepted: `configured` when set, else twice the model's safetensors files
    plus 64 MiB (fp32 master weights pushed over a bf16 checkpoint are twice its size)."""
    if configured:
        return configured
    files = sorted(model.glob("*.safetensors")) if model is not None and model.is_dir() else []
    return 2 * sum(file.stat().st_size for file in files) + _UPLOAD_MARGIN_BYTES


def checkpoint_files(path: str, checkpoint_dirs: Sequence[Path]) -> Path:
    """A `checkpoint_path` resolved and confined to `checkpoint_dirs` (PermissionDeniedError outside them,
    InvalidArgumentError when relative): the files read are the ones under it, whatever a symlink says."""
    return confined(path, checkpoint_dirs, "checkpoint_path", setting="--checkpoint-dirs")


def check_base(base_version: int, served: int) -> None:
    """Refuse a changed-only update against `base_version` when this replica serves `served` instead
    (FAILED_PRECONDITION: the sender must send the full state); 0 is not a changed-only update."""
    if base_version and base_version != served:
        raise FailedPreconditionError(
            f"this replica serves policy version {served}, and the changed-only update is against version "
            f"{base_version}: send the full state"
        )


def check_newer(version: int, served: int, writer: str, served_writer: str) -> None:
    """Refuse (INVALID_ARGUMENT) publishing `version` of `writer` over `served`, published by `served_writer`,
    unless it is newer; the reason names both writers."""
    if version <= served:
        raise InvalidArgumentError(
            f"policy version {version} is not newer than the served version {served} "
            f"(published by {_named(served_writer)}; this update is by {_named(writer)})"
        )


def _named(writer: str) -> str:
    return f"writer {writer!r}" if writer else "an unnamed writer"


class ReceivedUpdate(NamedTuple):
    """An UpdateWeights stream, read: the safetensors file or checkpoint path, the requested version, whether
    the file was spooled (the caller deletes it), the changed-only base (0: none) and the writer it names."""

    path: Path
    version: int
    spooled: bool
    base_version: int
    writer: str = ""


async def receive_update(
    requests: AsyncIterator[inference_pb2.UpdateWeightsRequest],
    spool_dir: Path,
    limits: UpdateLimits,
    base_check: Callable[[int], None] = lambda base: None,
) -> ReceivedUpdate:
    """Read an UpdateWeights stream (`base_check` is called with its base version before any byte is spooled).

    The stream is one `checkpoint_path` (confined to `limits.checkpoint_dirs`), or one `broadcast` (the
    payload is received from the trainer's torch.distributed group into a file in `spool_dir`:
    lodestar_inference/broadcast.py), or a `header` then `chunk`s adding up to `header.total_bytes`; a
    broadcast or a stream is at most `limits.max_bytes` (refused before anything is written) and is written
    to a file in `spool_dir` (spooled=True: the caller deletes it after the swap).
    """
    first = await anext(aiter(requests), None)
    if first is None:
        raise InvalidArgumentError("the weight update stream is empty")
    kind = first.WhichOneof("payload")
    if kind in ("checkpoint_path", "broadcast"):
        if await anext(aiter(requests), None) is not None:
            raise InvalidArgumentError(f"a {kind} update must be the only message of the stream")
        base_check(first.base_version)
        version, base, writer = first.policy_version, first.base_version, first.writer
        if kind == "checkpoint_path":
            path = checkpoint_files(first.checkpoint_path, limits.checkpoint_dirs)
            return ReceivedUpdate(path, version, False, base, writer)
        return ReceivedUpdate(await _receive_broadcast(first.broadcast, spool_dir, limits), version, True, base, writer)
    if kind != "header":
        raise InvalidArgumentError("a weight update stream starts with a header or a checkpoint_path")
    header = first.header
    base_check(header.base_version)
    if header.total_bytes > limits.max_bytes:
        raise InvalidArgumentError(
            f"weight update of {header.total_bytes} bytes is above this server's limit of {limits.max_bytes} "
            "bytes (--max-weights-bytes)"
        )
    descriptor, name = tempfile.mkstemp(dir=spool_dir, prefix="lodestar-weights-", suffix=".safetensors")
    path = Path(name)
    received = 0
    try:
        with os.fdopen(descriptor, "wb") as handle:
            async for message in requests:
                if message.WhichOneof("payload") != "chunk":
                    raise InvalidArgumentError("after the header, a weight update stream carries only chunks")
                received += len(message.chunk)
                if received > header.total_bytes:
                    raise InvalidArgumentError(
                        f"weight update carries more than the {header.total_bytes} bytes announced"
                    )
                handle.write(message.chunk)
        if received != header.total_bytes:
            raise InvalidArgumentError(f"weight update carried {received} of the {header.total_bytes} bytes announced")
    except BaseException:
        os.unlink(path)
        raise
    return ReceivedUpdate(path, header.policy_version, True, header.base_version, header.writer)


async def _receive_broadcast(spec: inference_pb2.WeightsBroadcast, spool_dir: Path, limits: UpdateLimits) -> Path:
    """The broadcast payload of `spec`, received into a new file in `spool_dir` (deleted on failure)."""
    from lodestar_inference.broadcast import check_layout, receive_broadcast  # torch: only when used

    check_layout(spec, limits.max_bytes)
    descriptor, name = tempfile.mkstemp(dir=spool_dir, prefix="lodestar-weights-", suffix=".safetensors")
    os.close(descriptor)
    path = Path(name)
    try:
        await asyncio.to_thread(receive_broadcast, spec, path, limits.max_bytes)
    except BaseException:
        os.unlink(path)
        raise
    return path


MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def in_memory(path: Path) -> bool:
    """Whether `path` lies on a filesystem held in memory (/dev/shm): a mapping of it reads RAM, not a disk."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    resolved, best, kind = path.resolve(), -1, ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if resolved.is_relative_to(point) and len(point.parts) > best:
            best, kind = len(point.parts), fields[2]
    return kind in MEMORY_FILESYSTEMS


def default_spool_dir() -> Path:
    """/dev/shm when it is a writable directory (fastest), else the temp directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())
