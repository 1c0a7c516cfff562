"""The receiving end of the torch.distributed weight data plane: join the trainer's group, land the bytes.

An `UpdateWeightsRequest.broadcast` names the trainer's TCPStore, this replica's rank and the payload's
layout (services/trainer/broadcast.py is the sending end). `receive_broadcast` writes the safetensors
header the message carries into a spool file, grows the file to the payload's size, maps it, and receives
each broadcast bucket straight into its place in the mapping: the bytes land once, in a file the server
then validates and hands to the engine exactly like a streamed update. Each replica joins a fresh group per
push (a replica that joined or left since the last version needs no regrouping; a group costs a few ms).

The group is a standalone `ProcessGroupGloo` / `ProcessGroupNCCL` over a `PrefixStore`: it never touches
the process's default group. Every wait is bounded by the message's `timeout_s` (the store connect, the
rendezvous and each bucket); a failure raises `UnavailableError`. NCCL (CUDA buffers, copied into the
mapping) is written against the same c10d API but untested here: no GPU in CI.
"""

from __future__ import annotations

import datetime
import os
import socket
import struct
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2

c10d: Any = torch.distributed
"""torch.distributed, untyped: its stubs leave out the stores and the process group options used here."""
_log = get_logger("inference.broadcast")
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def check_layout(spec: inference_pb2.WeightsBroadcast, max_bytes: int) -> int:
    """The data section's offset in the payload; InvalidArgumentError when the layout does not add up."""
    header = spec.safetensors_header
    if spec.backend not in ("gloo", "nccl"):
        raise InvalidArgumentError(f"weight broadcast backend {spec.backend!r} is not gloo or nccl")
    if not 0 < spec.rank < spec.world_size:
        raise InvalidArgumentError(f"weight broadcast rank {spec.rank} is not in 1..{spec.world_size - 1}")
    if spec.total_bytes > max_bytes:
        raise InvalidArgumentError(
            f"weight update of {spec.total_bytes} bytes is above this server's limit of {max_bytes} bytes "
            "(--max-weights-bytes)"
        )
    if len(header) < 8 or struct.unpack("<Q", header[:8])[0] != len(header) - 8 or len(header) > _MAX_HEADER_BYTES:
        raise InvalidArgumentError("weight broadcast: safetensors_header is not a safetensors header")
    if len(header) + sum(spec.bucket_bytes) != spec.total_bytes or not spec.timeout_s > 0:
        raise InvalidArgumentError("weight broadcast: header and buckets do not add up to total_bytes")
    return len(header)


def receive_broadcast(spec: inference_pb2.WeightsBroadcast, path: Path, max_bytes: int) -> None:
    """Join the group of `spec` and receive its payload into the new file `path` (blocking: run it in a
    thread). InvalidArgumentError for a bad layout (nothing joined), UnavailableError when the group or a
    bucket fails or times out."""
    data_start = check_layout(spec, max_bytes)
    with path.open("wb") as handle:
        handle.write(spec.safetensors_header)
        handle.truncate(spec.total_bytes)
    mapped = torch.from_file(str(path), shared=True, size=spec.total_bytes, dtype=torch.uint8)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    try:
        group = _join(spec, timeout)
    except (RuntimeError, ValueError) as error:  # c10d's DistError family is RuntimeError
        raise UnavailableError(f"could not join the trainer's weight broadcast: {error}") from error
    cuda = spec.backend == "nccl"
    offset = data_start
    try:
        for size in spec.bucket_bytes:
            target = mapped[offset : offset + size]
            buffer = torch.empty(size, dtype=torch.uint8, device="cuda") if cuda else target
            options = c10d.BroadcastOptions()
            options.rootRank = 0
            options.timeout = timeout
            group.broadcast([buffer], options).wait(timeout)
            if cuda:
                target.copy_(buffer)
            offset += size
    except (RuntimeError, ValueError) as error:
        raise UnavailableError(f"the trainer's weight broadcast failed after {offset} bytes: {error}") from error
    finally:
        _shutdown(group)
        del mapped
    _log.debug("weights received by broadcast", bytes=spec.total_bytes, group=spec.group, rank=spec.rank)


def _join(spec: inference_pb2.WeightsBroadcast, timeout: datetime.timedelta) -> Any:
    """This replica's end of the group: a store client, then the backend's process group (rank `spec.rank`)."""
    store = c10d.TCPStore(spec.store_host, spec.store_port, None, False, timeout)
    prefixed = c10d.PrefixStore(spec.group, store)
    if spec.backend == "nccl":
        options = c10d.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return c10d.ProcessGroupNCCL(prefixed, spec.rank, spec.world_size, options)
    options = c10d.ProcessGroupGloo._Options()
    options._timeout = timeout
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    device = (
        c10d.ProcessGroupGloo.create_device(interface=interface)
        if interface
        else c10d.ProcessGroupGloo.create_device(hostname=local_address(spec.store_host))
    )
    options._devices = [device]
    return c10d.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, options)


def _shutdown(group: Any) -> None:
    """Release the group's sockets (or communicators) now, not when the garbage collector gets to it."""
    shutdown = getattr(group, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except RuntimeError as error:  # a broken group may refuse; it is dropped either way
            _log.debug("weight broadcast group shutdown failed", error=str(error))


def local_address(peer: str) -> str:
    """The address of this host's interface that routes to `peer` (no packet is sent): gloo listens there."""
    with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostname()
