"""Push the policy's weights to InferenceService.UpdateWeights as one streamed safetensors payload.

The stream is a `WeightsHeader` (total bytes, the version to publish, the writer: the trainer's run id) and
chunks of the payload. The replica records the writer with the version it publishes and reports both
(`served_versions`: GetModelInfo's `policy_version` and `policy_writer`), so a restarted trainer can tell its
own run's versions from another writer's (weights/versions.py).
Inference validates the whole update before it swaps, and keeps serving the old version until the new
one is complete, so a push that fails midway changes nothing there. Each attempt has a deadline and waits
for the channel within it (an inference server that is restarting is waited for, not failed on);
UNAVAILABLE and DEADLINE_EXCEEDED are retried with backoff (after asking GetModelInfo whether the
timed-out attempt landed after all). A refusal (INVALID_ARGUMENT: names, shapes, dtypes, or a version
not newer than the served one) is not retried: it raises `WeightsRefusedError` with inference's reason.

The payload is in the dtype inference serves (GetModelInfo's `serving_dtype`, asked once): bf16 weights
on a GPU replica are half the bytes of the trainer's fp32 master, and inference would cast them to bf16
anyway. An inference that does not say (or cannot be asked) gets the state as it is.

Several replicas (`--inference A,B,C`, or those registered in etcd with `--inference-discovery etcd`):
`FanoutPublisher` serializes the state once and pushes it to every replica at once (one thread each); it
returns when every replica serves the version. A replica that refuses connections fails at once (no
wait-for-ready) and one that stays unreachable through every retry is skipped with an error log (it is dead,
and the gateway routes no session to it; a replica that comes back is brought up to date by the next push)
as long as one replica took the version; it gets a single attempt at later pushes until it takes one again,
so a dead replica costs a push milliseconds, not its retries. That try goes over a new channel: the old one
may sit in gRPC's reconnect backoff, failing at once with the dead process's "connection refused" for seconds
after a new process listens at the address (the re-run chaos hour reported three versions to rollout that a
restarted, registered replica had not been sent). A refusal from any replica stops training as with one.

Changed-only sync (`publish_delta`, weights/changes.py): the tensors that changed go to each replica with
their base version in the header; a replica that does not serve the base refuses (FAILED_PRECONDITION,
`StaleBaseError`) and gets the full state of the same version at once, as does a replica that missed the
last push. Each payload is serialized once, the full one only when some replica needs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
import torch
from safetensors.torch import save

from lodestar.errors import FailedPreconditionError, InvalidArgumentError, LodestarError, UnavailableError
from lodestar.grpc.client import split_targets
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_trainer.rpc import RETRYABLE, details_of, domain_error, status_of, sync_channel

if TYPE_CHECKING:
    from lodestar_trainer.weights.changes import Delta, Payloads

CHUNK_BYTES = 4 * 1024 * 1024
MAX_PARALLEL_PUSHES = 32
NO_REPLICA_POLL_S = 0.5
"""Replicas one fan-out pushes to at once (threads; each mostly waits on its stream)."""

_log = get_logger("trainer.publish")


def report_missed(version: int, took: bool, missed: Mapping[str, str]) -> None:
    """The misses of a push of `version` (replica -> why): UnavailableError when no replica `took` it, else each
    missed replica logged; the next push retries those (the publishers keep them apart)."""
    if not took:
        raise UnavailableError(f"no inference replica took policy version {version}: {dict(missed)}")
    for target, why in missed.items():
        _log.error(
            "a replica missed a policy version (unreachable); the next push retries it",
            replica=target,
            policy_version=version,
            error=why,
        )


class WeightsRefusedError(FailedPreconditionError):
    """Inference refused an update; the message carries its reason. Training cannot continue on it."""


class StaleBaseError(FailedPreconditionError):
    """A replica refused a changed-only update: it does not serve the update's base version (it gets the full
    state instead)."""


@dataclass(frozen=True)
class PublishResult:
    policy_version: int
    tensors: int
    payload_bytes: int
    """Bytes of the payload one replica was sent (the changed-only one when there was a base)."""
    seconds: float
    attempts: int
    full_replicas: tuple[str, ...] = ()
    """Changed-only pushes: the replicas that got the full state instead (behind, restarted, or no base)."""
    full_bytes: int = 0
    """Changed-only pushes: bytes of the full payload when one was built (0: every replica took the diff)."""


class ServedVersion(NamedTuple):
    """What a replica serves: the policy version and who published it (its pusher's run id; "" when unnamed)."""

    version: int
    writer: str


def served_of(info: inference_pb2.GetModelInfoResponse) -> ServedVersion:
    return ServedVersion(int(info.policy_version.version), info.policy_writer)


WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def serialize(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> bytes:
    """One safetensors payload of `state` (contiguous CPU tensors, no shared storage), its floating-point
    tensors cast to `dtype` when given."""
    if dtype is not None:
        state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    return save(dict(state))


def _requests(
    payload: bytes, version: int, base: int = 0, writer: str = ""
) -> Iterator[inference_pb2.UpdateWeightsRequest]:
    header = inference_pb2.WeightsHeader(
        total_bytes=len(payload), policy_version=version, base_version=base, writer=writer
    )
    yield inference_pb2.UpdateWeightsRequest(header=header)
    view = memoryview(payload)
    for start in range(0, len(payload), CHUNK_BYTES):
        yield inference_pb2.UpdateWeightsRequest(chunk=bytes(view[start : start + CHUNK_BYTES]))


class PayloadPublisher:
    """A publisher that moves one serialized payload: `publish` serializes the state once, in the payload
    dtype, and hands the bytes to `publish_payload` (WeightPublisher, FanoutPublisher, BroadcastPublisher;
    shared_fs writes its file straight from the tensors instead)."""

    def payload_dtype(self) -> torch.dtype | None:
        """The dtype the payload's floating-point tensors go in (None: as they are)."""
        raise NotImplementedError

    def publish_payload(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        """Make inference serve `payload` (`tensors` tensors) as `version`; `started`: the push's
        perf_counter start."""
        raise NotImplementedError

    def prepare(self, state: Mapping[str, torch.Tensor]) -> bytes:
        """The safetensors payload of `state` in the payload dtype."""
        return serialize(state, self.payload_dtype())

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
        """Make inference serve `state` as policy `version`; returns once it does."""
        started = time.perf_counter()
        return self.publish_payload(self.prepare(state), len(state), version, started)


class WeightPublisher(PayloadPublisher):
    """UpdateWeights client with deadline and retries (see the module docstring)."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 300.0,
        attempts: int = 3,
        backoff_s: float = 2.0,
        wait_for_ready: bool = True,
        writer: str = "",
    ) -> None:
        """`wait_for_ready=False`: a replica that refuses connections fails its attempt at once instead of
        being waited for until the deadline (the fan-out's choice: the other replicas take the version);
        `writer`: the identity every push carries (the trainer's run id)."""
        self.target = target
        self.writer = writer
        self._timeout_s = timeout_s
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._wait_for_ready = wait_for_ready
        self._channel = sync_channel(target)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._wire: str | None = None

    def close(self) -> None:
        self._channel.close()

    def wire_dtype(self) -> str:
        """The dtype inference serves in ("" when it does not say or cannot be asked now)."""
        if self._wire is None:
            try:
                info = self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=min(self._timeout_s, 30.0))
            except grpc.RpcError:
                return ""
            self._wire = info.serving_dtype if info.serving_dtype in WIRE_DTYPES else ""
        return self._wire

    def payload_dtype(self) -> torch.dtype | None:
        """The dtype inference serves (None when it does not say: the state goes as it is)."""
        return WIRE_DTYPES.get(self.wire_dtype())

    def served(self) -> ServedVersion:
        """The version inference serves now, and its writer."""
        try:
            info = self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=min(self._timeout_s, 30.0))
        except grpc.RpcError as error:
            raise domain_error(error, f"GetModelInfo to {self.target}") from error
        return served_of(info)

    def served_version(self) -> int:
        """The version inference serves now."""
        return self.served().version

    def served_versions(self) -> dict[str, ServedVersion]:
        """{this replica: what it serves} (LodestarError when it does not answer)."""
        return {self.target: self.served()}

    def publish_payload(
        self, payload: bytes, tensors: int, version: int, started: float, attempts: int | None = None, base: int = 0
    ) -> PublishResult:
        """`publish` of an already serialized state (`tensors` tensors); `started`: its perf_counter start;
        `attempts`: this many instead of the configured number; `base`: the payload is changed-only against
        that version (StaleBaseError when the replica serves another)."""
        last = ""
        attempts = self._attempts if attempts is None else max(1, attempts)
        for attempt in range(1, attempts + 1):
            try:
                reply = self._stub.UpdateWeights(
                    _requests(payload, version, base, self.writer),
                    timeout=self._timeout_s,
                    wait_for_ready=self._wait_for_ready,
                )
            except grpc.RpcError as error:
                code = status_of(error)
                if code == grpc.StatusCode.FAILED_PRECONDITION and base:
                    raise StaleBaseError(f"inference at {self.target}: {details_of(error)}") from error
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise WeightsRefusedError(
                        f"inference at {self.target} refused the weights of policy version {version}: "
                        f"{details_of(error)}"
                    ) from error
                if code not in RETRYABLE:
                    raise domain_error(error, f"UpdateWeights to {self.target}") from error
                last = f"{code.name}: {details_of(error)}"
                _log.warning("weight push failed, retrying", attempt=attempt, policy_version=version, error=last)
                if self._landed(version):
                    return PublishResult(version, tensors, len(payload), time.perf_counter() - started, attempt)
                if attempt < attempts:
                    time.sleep(self._backoff_s * 2 ** (attempt - 1))
                continue
            return PublishResult(
                int(reply.policy_version),
                int(reply.tensors_updated),
                len(payload),
                time.perf_counter() - started,
                attempt,
            )
        raise UnavailableError(
            f"could not push policy version {version} to inference at {self.target} after {attempts} attempts ({last})"
        )

    def publish_delta(self, delta: Delta) -> PublishResult:
        """Push a changed-only version (see the module docstring)."""
        from lodestar_trainer.weights.changes import Payloads

        return push_delta(self, Payloads(delta))

    def _landed(self, version: int) -> bool:
        """Whether a timed-out push was applied after all (inference already serves `version`)."""
        try:
            return self.served_version() >= version
        except LodestarError:  # cannot ask: assume it did not land, the retry will tell
            return False


class FanoutPublisher(PayloadPublisher):
    """WeightPublisher over several replicas (see the module docstring): fixed addresses, or a function that
    names the live replicas at each push (replicas discovered in etcd: weights/replica_discovery.py)."""

    def __init__(
        self,
        targets: Sequence[str] | Callable[[], Sequence[str]],
        *,
        on_close: Callable[[], None] | None = None,
        **options: Any,
    ) -> None:
        """`on_close`: called by `close()` (stops the discovery behind `targets`); `options`: WeightPublisher's
        (`writer`: the identity every push carries)."""
        if not callable(targets) and not targets:
            raise InvalidArgumentError("no inference replica to publish weights to")
        self._targets = targets if callable(targets) else lambda: targets
        self._options = {"wait_for_ready": False, **options}
        self._by_target: dict[str, WeightPublisher] = {}
        self._missed: set[str] = set()
        """Replicas that missed the last version (unreachable): the next push tries them once, no retries."""
        self._pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL_PUSHES, thread_name_prefix="publish")
        self._on_close = on_close

    @property
    def target(self) -> str:
        return ",".join(self._targets())

    @property
    def writer(self) -> str:
        return str(self._options.get("writer", ""))

    @property
    def publishers(self) -> list[WeightPublisher]:
        """One publisher per replica named now (those of replicas no longer named are closed)."""
        targets = list(dict.fromkeys(self._targets()))
        for gone in set(self._by_target) - set(targets):
            self._by_target.pop(gone).close()
            self._missed.discard(gone)
        for target in targets:
            if target not in self._by_target:
                self._by_target[target] = WeightPublisher(target, **self._options)
        return [self._by_target[target] for target in targets]

    def _live_publishers(self) -> list[WeightPublisher]:
        """The publishers of the replicas named now; when none is (discovered replicas all gone, or not
        registered yet), wait for one up to the push deadline rather than fail the trainer at once."""
        deadline = time.monotonic() + self._options.get("timeout_s", 300.0)
        while not (publishers := self.publishers) and time.monotonic() < deadline:
            time.sleep(NO_REPLICA_POLL_S)
        return publishers

    def _tries(self, target: str) -> int | None:
        return 1 if target in self._missed else None

    def _push_publishers(self) -> list[WeightPublisher]:
        """The live publishers, a new one (a new channel) for each replica that missed the last push."""
        for target in self._missed & set(self._by_target):
            self._by_target.pop(target).close()
        return self._live_publishers()

    def close(self) -> None:
        for publisher in self._by_target.values():
            publisher.close()
        self._pool.shutdown(wait=False)
        if self._on_close is not None:
            self._on_close()

    def served_version(self) -> int:
        """The oldest version a reachable replica serves (LodestarError when none answers)."""
        return min(served.version for served in self.served_versions().values())

    def served_versions(self) -> dict[str, ServedVersion]:
        """What each reachable replica serves (LodestarError when none answers)."""
        served: dict[str, ServedVersion] = {}
        last: LodestarError = UnavailableError("no inference replica is registered")
        for publisher in self._live_publishers():
            try:
                served[publisher.target] = publisher.served()
            except LodestarError as error:
                last = error
        if not served:
            raise last
        return served

    def payload_dtype(self) -> torch.dtype | None:
        """The replicas' common serving dtype (None when they differ or do not say: the state goes as it is)."""
        wire = {publisher.wire_dtype() for publisher in self.publishers}
        return WIRE_DTYPES.get(wire.pop()) if len(wire) == 1 else None

    def publish_payload(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        """To every replica at once."""
        futures = {
            p.target: self._pool.submit(p.publish_payload, payload, tensors, version, started, self._tries(p.target))
            for p in self._push_publishers()
        }
        results = self._collect(futures, version)
        return PublishResult(
            version, tensors, len(payload), time.perf_counter() - started, max(r.attempts for r in results)
        )

    def publish_delta(self, delta: Delta) -> PublishResult:
        """A changed-only version to every replica at once; a replica that missed the last push gets the full
        state without trying the diff (see the module docstring)."""
        from lodestar_trainer.weights.changes import Payloads

        payloads = Payloads(delta)
        futures = {
            p.target: self._pool.submit(push_delta, p, payloads, self._tries(p.target), p.target not in self._missed)
            for p in self._push_publishers()
        }
        results = self._collect(futures, delta.version)
        full = tuple(target for result in results for target in result.full_replicas)
        return PublishResult(
            delta.version,
            min(r.tensors for r in results),
            min(r.payload_bytes for r in results),
            time.perf_counter() - delta.started,
            max(r.attempts for r in results),
            full,
            payloads.full_bytes,
        )

    def _collect(self, futures: Mapping[str, Future[PublishResult]], version: int) -> list[PublishResult]:
        """The replicas' results; the unreachable ones remembered and reported (none reached: UnavailableError)."""
        results: list[PublishResult] = []
        unreachable: dict[str, str] = {}
        for target, future in futures.items():
            try:
                results.append(future.result())
            except WeightsRefusedError:
                raise
            except UnavailableError as error:
                unreachable[target] = error.message
        self._missed = set(unreachable)
        report_missed(version, bool(results), unreachable)
        return results


def push_delta(
    publisher: WeightPublisher, payloads: Payloads, attempts: int | None = None, try_diff: bool = True
) -> PublishResult:
    """One replica's changed-only push: the diff against its base (unless `try_diff` is False or there is no
    base), and the full state of the same version when the replica refuses it (StaleBaseError)."""
    delta = payloads.delta
    if delta.base and try_diff:
        try:
            return publisher.publish_payload(
                payloads.diff(), len(delta.changed), delta.version, delta.started, attempts, base=delta.base
            )
        except StaleBaseError as stale:
            _log.info("a replica refused the changed-only update; sending it the full state", reason=stale.message)
    result = publisher.publish_payload(payloads.full(), len(delta.state), delta.version, delta.started, attempts)
    return replace(result, full_replicas=(publisher.target,) if delta.base else ())


def publisher_for(targets: str, **options: Any) -> WeightPublisher | FanoutPublisher:
    """The publisher of `--inference`: one replica's, or a fan-out over several (comma-separated)."""
    addresses = split_targets(targets)
    if len(addresses) == 1:
        return WeightPublisher(addresses[0], **options)
    return FanoutPublisher(addresses, **options)
