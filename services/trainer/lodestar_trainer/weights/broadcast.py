"""Weights over a torch.distributed broadcast (`weights_transport = "broadcast"`); gRPC is the control plane.

One push: probe every replica (GetModelInfo, short deadline: a dead one is left out at once), open a c10d
TCPStore on a free port, and send each live replica an UpdateWeights whose one message is a
`WeightsBroadcast` (the store's address, a fresh group name, the payload's safetensors header and bucket
sizes). The trainer (rank 0) and each replica (rank 1) form a group of two; the trainer broadcasts the
payload's data section to all the groups at once, in buckets of whole tensors (`bucket_bytes`); each
replica receives them straight into a spool file (lodestar_inference/broadcast.py), then validates and
swaps as for a streamed update and answers its call. The trainer serializes once; the bytes carry no gRPC
framing and are written once on the replica.

A group of two per replica, not one of N+1: gloo connects every rank of a group to every other, so in one
big group a replica that dies while the group forms stalls every other replica's rendezvous for longer than
the timeout (docs/benchmarks.md), where with pairs it fails only its own transfer. The price: the trainer sends one
copy per replica (as the gRPC path does), where a tree inside one group could send fewer. A fresh set of
groups per push: replicas that joined or left since the last version need no regrouping (forming a group
takes milliseconds).

The store and gloo's sockets listen on `host` only (the configured address, else the one on the route to
the first replica), never on every interface. The store itself has no authentication, so each push carries
a fresh secret over the authenticated UpdateWeights call: before any bucket a replica's rank proves it holds
the secret (a stranger that took its rank gets nothing), the trainer proves it back, and a MAC of the data
follows the buckets (lodestar/broadcast_auth.py, docs/security.md). A group whose peer fails its proof is
given up like one that did not form: that replica gets the version over gRPC.

Every wait is bounded: the rendezvous and each bucket by `broadcast_timeout_s` (gloo's timeout); a
replica whose control call ends before its group forms (not serving, refused) has its group given up at
once. A replica the broadcast missed (its group failed, it died mid-transfer, a timeout) is probed again
and, if it answers, gets the version over today's gRPC stream (publish.py); one that does not answer is
skipped as FanoutPublisher skips an unreachable replica. A refusal (INVALID_ARGUMENT) stops training.

Changed-only (`publish_delta`, weights/changes.py): the probe tells each replica's version; those serving
the base get the changed tensors (the request names the base), the others the full state, each set in its
own broadcast; a replica either broadcast missed gets the version over gRPC (the diff when it serves the
base, else, or when it refuses the diff, the full state).

`backend = "nccl"` is the same code with CUDA tensors (the payload is copied to the GPU bucket by bucket);
it is written against c10d's ProcessGroupNCCL but untested: CI has no GPU.
"""

from __future__ import annotations

import datetime
import hmac
import json
import os
import socket
import struct
import threading
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed

from lodestar import broadcast_auth
from lodestar.errors import UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2
from lodestar_trainer.weights.publish import PayloadPublisher, PublishResult, StaleBaseError, push_delta
from lodestar_trainer.weights.replica_set import Outcome, ReplicaSet, ReplicaSetPublisher, Targets, collect

if TYPE_CHECKING:
    from lodestar_trainer.weights.changes import Delta, Payloads

c10d: Any = torch.distributed
"""torch.distributed, untyped: its stubs leave out the stores and the process group options used here."""
_log = get_logger("trainer.broadcast")
Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class _Push:
    """One push's payload layout and secret, as each replica's group sees it."""

    payload: bytes
    data_start: int
    sizes: Sequence[int]
    secret: bytes


def bucket_sizes(payload: bytes, bucket_bytes: int) -> tuple[int, list[int]]:
    """(offset of the data section, sizes of consecutive buckets of whole tensors covering it): a bucket
    closes before the tensor that would take it past `bucket_bytes` (a larger tensor is a bucket alone)."""
    (header_len,) = struct.unpack("<Q", payload[:8])
    start = 8 + header_len
    header = json.loads(payload[8:start])
    ends = sorted(int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__")
    sizes: list[int] = []
    opened = 0
    previous = 0
    for end in ends:
        if end - opened > bucket_bytes and previous > opened:
            sizes.append(previous - opened)
            opened = previous
        previous = end
    data = len(payload) - start
    if data > opened:
        sizes.append(data - opened)
    return start, sizes


class BroadcastPublisher(ReplicaSetPublisher, PayloadPublisher):
    """Publisher of `weights_transport = "broadcast"` (see the module docstring)."""

    def __init__(
        self,
        targets: Targets,
        *,
        backend: Backend = "gloo",
        host: str = "",
        port: int = 0,
        broadcast_timeout_s: float = 30.0,
        bucket_bytes: int = 256 * 1024 * 1024,
        timeout_s: float = 300.0,
        attempts: int = 3,
        backoff_s: float = 2.0,
        probe_timeout_s: float = 5.0,
        on_close: Callable[[], None] | None = None,
        writer: str = "",
    ) -> None:
        """`host`: the address replicas reach the trainer's store and gloo sockets at (default: this host's
        address on the route to the first replica); `port`: the store's port (0: a free one)."""
        self.replicas = ReplicaSet(
            targets,
            timeout_s=timeout_s,
            attempts=attempts,
            backoff_s=backoff_s,
            probe_timeout_s=probe_timeout_s,
            on_close=on_close,
            writer=writer,
        )
        self.backend: Backend = backend
        self._host = host
        self._port = port
        self._timeout = datetime.timedelta(seconds=broadcast_timeout_s)
        self._bucket_bytes = max(1, bucket_bytes)
        self.last_broadcast: list[str] = []
        """The replicas that took the latest version through the broadcast (the others, if any, by gRPC)."""

    def publish_payload(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        """Broadcast `payload` as `version` to every live replica; stream it to those the broadcast missed."""
        targets = self.replicas.targets()
        live = self.replicas.live(targets)
        outcomes: dict[str, Outcome] = {}
        if live:
            outcomes.update(self._broadcast(live, payload, version, started))
        self.last_broadcast = [target for target in live if isinstance(outcomes.get(target), PublishResult)]
        missed = [target for target in targets if not isinstance(outcomes.get(target), PublishResult)]
        if missed:
            if any(not isinstance(outcomes.get(target), PublishResult) for target in live):
                _log.warning(
                    "weight broadcast missed replicas; streaming the version to them over gRPC",
                    policy_version=version,
                    replicas=missed,
                )
            answering = self.replicas.live(missed) if live else missed  # none answered: wait for them as today
            futures = self.replicas.submit(self._stream, answering, payload, tensors, version, started)
            outcomes.update(collect(futures))
            for target in set(missed) - set(answering):
                outcomes[target] = UnavailableError(f"inference at {target} does not answer GetModelInfo")
        return self.replicas.settle(version, tensors, len(payload), started, outcomes)

    def _stream(self, target: str, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        return self.replicas.streamer(target).publish_payload(payload, tensors, version, started)

    def publish_delta(self, delta: Delta) -> PublishResult:
        """Broadcast the changed tensors to the live replicas at the base and the full state to the other live
        ones; stream the version to those the broadcasts missed (see the module docstring)."""
        from lodestar_trainer.weights.changes import Payloads

        payloads = Payloads(delta)
        targets = self.replicas.targets()
        versions = self.replicas.live_versions(targets)
        at_base = [target for target, served in versions.items() if delta.base and served == delta.base]
        behind = [target for target in versions if target not in at_base]
        outcomes: dict[str, Outcome] = {}
        if at_base:
            outcomes |= self._broadcast(at_base, payloads.diff(), delta.version, delta.started, delta.base)
        if behind:
            outcomes |= self._broadcast(behind, payloads.full(), delta.version, delta.started)
        self.last_broadcast = [target for target in versions if isinstance(outcomes.get(target), PublishResult)]
        missed = [target for target in targets if not isinstance(outcomes.get(target), PublishResult)]
        diffable = [t for t in at_base if not isinstance(outcomes.get(t), StaleBaseError)]
        if missed:
            answering = self.replicas.live(missed) if versions else missed  # none answered: wait for them
            outcomes.update(collect(self.replicas.submit(self._stream_delta, answering, payloads, diffable)))
            for target in set(missed) - set(answering):
                outcomes[target] = UnavailableError(f"inference at {target} does not answer GetModelInfo")
        tensors = len(delta.changed) if delta.base else len(delta.state)
        nbytes = len(payloads.diff() if at_base else payloads.full())
        result = self.replicas.settle(delta.version, tensors, nbytes, delta.started, outcomes)
        full = [t for t in behind if delta.base and t in self.last_broadcast]
        full += [t for o in outcomes.values() if isinstance(o, PublishResult) for t in o.full_replicas]
        return PublishResult(
            delta.version, tensors, nbytes, result.seconds, result.attempts, tuple(full), payloads.full_bytes
        )

    def _stream_delta(self, target: str, payloads: Payloads, diffable: Sequence[str]) -> PublishResult:
        return push_delta(self.replicas.streamer(target), payloads, try_diff=target in diffable)

    # -- the data plane ----------------------------------------------------------------------------------

    def _broadcast(
        self, targets: Sequence[str], payload: bytes, version: int, started: float, base: int = 0
    ) -> dict[str, Outcome]:
        """Each of `targets`' outcome of one broadcast of `payload` (UnavailableError for those it missed; `base`:
        the payload is changed-only against it)."""
        data_start, sizes = bucket_sizes(payload, self._bucket_bytes)
        host = self._host or _route_to(targets[0])
        store = _listening_store(host, self._port, self._timeout)
        push = f"lodestar-weights/v{version}/{uuid.uuid4().hex[:12]}"
        sending = _Push(payload, data_start, sizes, broadcast_auth.new_secret())
        spec = inference_pb2.WeightsBroadcast(
            store_host=host,
            store_port=int(store.port),
            backend=self.backend,
            rank=1,
            world_size=2,
            timeout_s=self._timeout.total_seconds(),
            total_bytes=len(payload),
            safetensors_header=payload[:data_start],
            bucket_bytes=sizes,
            secret=sending.secret,
        )
        calls: dict[str, Future[Outcome]] = {}
        sends: list[Future[Any]] = []
        for index, target in enumerate(targets):
            request = self.replicas.update_request(version, base)
            request.broadcast.CopyFrom(spec)
            request.broadcast.group = f"{push}/{index}"
            joined = _in_thread(self._join, store, request.broadcast.group, host)  # rank 0 taken before the call
            calls |= self.replicas.submit(self.replicas.call_once, [target], request, version, len(payload), started)
            sends.append(_in_thread(self._serve, target, joined, calls[target], sending, request.broadcast.group))
        for send in sends:
            send.result()
        outcomes = collect(calls)
        del store
        return outcomes

    def _serve(self, target: str, joined: Future[Any], call: Future[Outcome], push: _Push, name: str) -> None:
        """Send the buckets to `target` once its group formed and its peer proved the push's secret (nothing
        when the group did not form, its call ended, or the peer is a stranger)."""
        group = _await_group(target, joined, call)
        if group is None:
            return
        try:
            nonces = self._handshake(group, push.secret, name)
            if nonces is None:
                _log.warning(
                    "a peer without the push's secret took a replica's rank: no weights sent to it",
                    replica=target,
                    group=name,
                )
                return
            mac = broadcast_auth.data_mac(push.secret, name, nonces)
            self._send(group, push, mac)
            self._exchange(group, torch.frombuffer(bytearray(mac.digest()), dtype=torch.uint8), root=0)
        except (RuntimeError, ValueError) as error:  # c10d's errors are RuntimeErrors
            _log.warning("weight broadcast to a replica failed", replica=target, error=str(error))
        finally:
            _shutdown(group)

    def _join(self, store: Any, group_name: str, host: str) -> Any:
        """The trainer's end (rank 0) of one replica's two-rank group."""
        prefixed = c10d.PrefixStore(group_name, store)
        if self.backend == "nccl":
            options = c10d.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            return c10d.ProcessGroupNCCL(prefixed, 0, 2, options)
        options = c10d.ProcessGroupGloo._Options()
        options._timeout = self._timeout
        options._devices = [c10d.ProcessGroupGloo.create_device(hostname=host)]
        return c10d.ProcessGroupGloo(prefixed, 0, 2, options)

    def _handshake(self, group: Any, secret: bytes, name: str) -> tuple[bytes, bytes] | None:
        """Both nonces once the peer proved the secret and the trainer proved it back; None for a stranger."""
        ours = broadcast_auth.new_nonce()
        self._exchange(group, torch.frombuffer(bytearray(ours), dtype=torch.uint8), root=0)
        answer = torch.zeros(broadcast_auth.NONCE_BYTES + broadcast_auth.PROOF_BYTES, dtype=torch.uint8)
        answer = self._exchange(group, answer, root=1)
        theirs, shown = bytes(answer[: broadcast_auth.NONCE_BYTES]), bytes(answer[broadcast_auth.NONCE_BYTES :])
        if not broadcast_auth.same(broadcast_auth.proof(secret, "replica", name, ours), shown):
            return None
        back = broadcast_auth.proof(secret, "trainer", name, theirs)
        self._exchange(group, torch.frombuffer(bytearray(back), dtype=torch.uint8), root=0)
        return ours, theirs

    def _exchange(self, group: Any, buffer: torch.Tensor, *, root: int) -> torch.Tensor:
        """One broadcast of a small CPU uint8 `buffer` from `root`; the buffer as every rank now holds it."""
        moved = buffer.to("cuda") if self.backend == "nccl" else buffer
        options = c10d.BroadcastOptions()
        options.rootRank = root
        options.timeout = self._timeout
        group.broadcast([moved], options).wait(self._timeout)
        return moved.cpu() if self.backend == "nccl" else moved

    def _send(self, group: Any, push: _Push, mac: hmac.HMAC) -> None:
        with warnings.catch_warnings():  # bytes are read-only; the root of a broadcast only reads them
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(push.payload, dtype=torch.uint8)
        view = memoryview(push.payload)
        offset = push.data_start
        for size in push.sizes:
            bucket = data[offset : offset + size]
            if self.backend == "nccl":
                bucket = bucket.to("cuda", non_blocking=True)
            options = c10d.BroadcastOptions()
            options.rootRank = 0
            options.timeout = self._timeout
            work = group.broadcast([bucket], options)
            mac.update(view[offset : offset + size])  # while the bucket travels
            work.wait(self._timeout)
            offset += size


def _await_group(target: str, joined: Future[Any], call: Future[Outcome]) -> Any:
    """`target`'s formed group, or None when it failed or the replica's call ended first (the replica will
    not join: the group is given up at once rather than waited out)."""
    done, _ = wait([joined, call], return_when=FIRST_COMPLETED)
    if joined in done:
        try:
            return joined.result()
        except (RuntimeError, ValueError) as error:
            _log.warning("weight broadcast group did not form", replica=target, error=str(error))
            return None
    _log.warning(
        "a replica ended its call before joining the weight broadcast", replica=target, error=str(call.result())
    )
    return None


def _in_thread(call: Any, *args: Any) -> Future[Any]:
    """`call(*args)` on a daemon thread: a rendezvous given up on must not keep the process from exiting."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(call(*args))
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name="weight-broadcast-join", daemon=True).start()
    return future


def _shutdown(group: Any) -> None:
    shutdown = getattr(group, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except RuntimeError as error:
            _log.debug("weight broadcast group shutdown failed", error=str(error))


def _listening_store(host: str, port: int, timeout: datetime.timedelta) -> Any:
    """The push's TCPStore, listening on `host` only (c10d's own listener takes every interface): a socket
    bound here, handed over (the store closes it)."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
        bound = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    fd = listener.detach()
    try:
        return c10d.TCPStore(host, bound, None, True, timeout, wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def _route_to(target: str) -> str:
    """This host's address on the route to `target` ("host:port"; no packet is sent)."""
    host = target.rsplit(":", 1)[0].strip("[]")
    try:
        peer = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(peer[0], socket.SOCK_DGRAM) as probe:
            probe.connect(peer[4])
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()
