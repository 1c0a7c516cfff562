"""The receiving end of the torch.distributed weight data plane: join the trainer's group, land the bytes.

An `UpdateWeightsRequest.broadcast` names the trainer's TCPStore, this replica's rank and the payload's
layout (lodestar_trainer/weights/broadcast.py is the sending end). `receive_broadcast` writes the safetensors
header the message carries into a spool file, grows the file to the payload's size, maps it, and receives
each broadcast bucket straight into its place in the mapping: the bytes land once, in a file the server
then validates and hands to the engine exactly like a streamed update. Each replica joins a fresh group per
push (a replica that joined or left since the last version needs no regrouping; a group costs a few ms).

Before any bucket the two ranks prove to each other that they hold the push's secret (sent in the
authenticated UpdateWeights call), and after the last one the replica checks the trainer's MAC of the data:
a stranger that took the trainer's rank in the open store is refused before anything is received, and bytes
changed on the way are never handed to the engine (lodestar/broadcast_auth.py).

The group is a standalone `ProcessGroupGloo` / `ProcessGroupNCCL` over a `PrefixStore`: it never touches
the process's default group. Every wait is bounded by the message's `timeout_s` (the store connect, the
rendezvous and each bucket); a failure raises `UnavailableError`. NCCL (CUDA buffers, copied into the
mapping) is written against the same c10d API but untested here: no GPU in CI.
"""

from __future__ import annotations

import datetime
import hmac
import os
import socket
import struct
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from lodestar import broadcast_auth
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
    broadcast_auth.check_secret(spec.secret)
    return len(header)


def receive_broadcast(spec: inference_pb2.WeightsBroadcast, path: Path, max_bytes: int) -> None:
    """Join the group of `spec` and receive its payload into the new file `path` (blocking: run it in a
    thread). InvalidArgumentError for a bad layout or no secret (nothing joined), UnavailableError when the
    group or a bucket fails or times out, or the peer or the data fail the push's secret."""
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
        mac = broadcast_auth.data_mac(spec.secret, spec.group, _handshake(group, spec, timeout))
        landed: torch.Tensor | None = None  # the previous bucket, hashed while the next one travels
        for size in spec.bucket_bytes:
            target = mapped[offset : offset + size]
            buffer = torch.empty(size, dtype=torch.uint8, device="cuda") if cuda else target
            work = group.broadcast([buffer], _options(0, timeout))
            if landed is not None:
                mac.update(landed.numpy().data)
            work.wait(timeout)
            if cuda:
                target.copy_(buffer)
            landed = target
            offset += size
        if landed is not None:
            mac.update(landed.numpy().data)
        _check_mac(group, mac, spec, timeout)
    except (RuntimeError, ValueError) as error:
        raise UnavailableError(f"the trainer's weight broadcast failed after {offset} bytes: {error}") from error
    finally:
        _shutdown(group)
        del mapped
    _log.debug("weights received by broadcast", bytes=spec.total_bytes, group=spec.group, rank=spec.rank)


def _handshake(group: Any, spec: inference_pb2.WeightsBroadcast, timeout: datetime.timedelta) -> tuple[bytes, bytes]:
    """(trainer's nonce, ours) once this rank proved the push's secret and rank 0 proved it back;
    UnavailableError when rank 0 cannot (a stranger took the trainer's place in the open store)."""
    theirs = bytes(_broadcast(group, torch.zeros(broadcast_auth.NONCE_BYTES, dtype=torch.uint8), 0, timeout))
    ours = broadcast_auth.new_nonce()
    answer = ours + broadcast_auth.proof(spec.secret, "replica", spec.group, theirs)
    _broadcast(group, torch.frombuffer(bytearray(answer), dtype=torch.uint8), spec.rank, timeout)
    back = bytes(_broadcast(group, torch.zeros(broadcast_auth.PROOF_BYTES, dtype=torch.uint8), 0, timeout))
    if not broadcast_auth.same(broadcast_auth.proof(spec.secret, "trainer", spec.group, ours), back):
        raise UnavailableError("weight broadcast: rank 0 does not hold the push's secret (not the trainer)")
    return theirs, ours


def _check_mac(group: Any, mac: hmac.HMAC, spec: inference_pb2.WeightsBroadcast, timeout: datetime.timedelta) -> None:
    sent = bytes(_broadcast(group, torch.zeros(broadcast_auth.PROOF_BYTES, dtype=torch.uint8), 0, timeout))
    if not broadcast_auth.same(mac.digest(), sent):
        raise UnavailableError(f"weight broadcast: the data of {spec.group} fails the push's MAC (changed on the way)")


def _broadcast(group: Any, buffer: torch.Tensor, root: int, timeout: datetime.timedelta) -> torch.Tensor:
    """One broadcast from `root` into (or out of) `buffer`, returned; a CPU buffer goes through the GPU when
    the group is NCCL's."""
    moved = buffer.to("cuda") if buffer.device.type == "cpu" and _is_nccl(group) else buffer
    group.broadcast([moved], _options(root, timeout)).wait(timeout)
    if moved is not buffer:
        buffer.copy_(moved.cpu())
    return buffer


def _options(root: int, timeout: datetime.timedelta) -> Any:
    options = c10d.BroadcastOptions()
    options.rootRank = root
    options.timeout = timeout
    return options


def _is_nccl(group: Any) -> bool:
    nccl = getattr(c10d, "ProcessGroupNCCL", None)
    return nccl is not None and isinstance(group, nccl)


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
