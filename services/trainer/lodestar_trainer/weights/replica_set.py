"""The inference replicas a weight transport publishes to (shared_fs.py, broadcast.py): their addresses at
each push, a control channel to each, their serving dtype, and how the replicas' outcomes make the push's.

The outcome rules are FanoutPublisher's (publish.py): a refusal from any replica stops training
(`WeightsRefusedError`); a replica that cannot be reached is skipped with an error log as long as one
replica took the version (the next push brings it up to date); none taking it is an UnavailableError.
`live` asks every replica's GetModelInfo with a short deadline and no wait-for-ready, so a dead replica
costs a push a refused connection (or `probe_timeout_s` when it hangs), not the UpdateWeights deadline.
A changed-only update (`base_version` set) that a replica refuses with FAILED_PRECONDITION is its
`StaleBaseError` outcome: the publisher sends that replica the full state (weights/changes.py).
Every update names the set's `writer` (the trainer's run id: `update_request`, and the fallback streams).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import torch

from lodestar.errors import InvalidArgumentError, LodestarError, UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_trainer.rpc import RETRYABLE, details_of, domain_error, status_of, sync_channel
from lodestar_trainer.weights.publish import (
    WIRE_DTYPES,
    PublishResult,
    ServedVersion,
    StaleBaseError,
    WeightPublisher,
    WeightsRefusedError,
    report_missed,
)

_log = get_logger("trainer.publish")
MAX_PARALLEL = 32
"""Replicas sent to at once (threads; each mostly waits on its call)."""

Targets = Sequence[str] | Callable[[], Sequence[str]]
Outcome = PublishResult | LodestarError


class ReplicaSet:
    """Channels, probes and fallback publishers of the replicas named by `targets` (a list, or a function
    naming them at each push, e.g. replicas discovered in etcd)."""

    def __init__(
        self,
        targets: Targets,
        *,
        timeout_s: float = 300.0,
        attempts: int = 3,
        backoff_s: float = 2.0,
        probe_timeout_s: float = 5.0,
        on_close: Callable[[], None] | None = None,
        writer: str = "",
    ) -> None:
        """`on_close`: called by `close()` (stops the discovery behind `targets`); `writer`: the identity every
        update carries (the trainer's run id)."""
        if not callable(targets) and not targets:
            raise InvalidArgumentError("no inference replica to publish weights to")
        self._targets = targets
        self.writer = writer
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.probe_timeout_s = probe_timeout_s
        self._stubs: dict[str, tuple[grpc.Channel, inference_pb2_grpc.InferenceServiceStub]] = {}
        self._streams: dict[str, WeightPublisher] = {}
        self._dtypes: dict[str, str] = {}
        self.pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="publish")
        self._on_close = on_close

    def targets(self) -> list[str]:
        named = self._targets() if callable(self._targets) else self._targets
        return list(dict.fromkeys(named))

    def stub(self, target: str) -> inference_pb2_grpc.InferenceServiceStub:
        if target not in self._stubs:
            channel = sync_channel(target)
            self._stubs[target] = (channel, inference_pb2_grpc.InferenceServiceStub(channel))
        return self._stubs[target][1]

    def streamer(self, target: str) -> WeightPublisher:
        """The gRPC stream publisher of `target` (today's path: the fallback of the other transports)."""
        if target not in self._streams:
            self._streams[target] = WeightPublisher(
                target, timeout_s=self.timeout_s, attempts=self.attempts, backoff_s=self.backoff_s, writer=self.writer
            )
        return self._streams[target]

    def close(self) -> None:
        for channel, _ in self._stubs.values():
            channel.close()
        for publisher in self._streams.values():
            publisher.close()
        self.pool.shutdown(wait=False)
        if self._on_close is not None:
            self._on_close()

    def probe(self, target: str) -> inference_pb2.GetModelInfoResponse | None:
        """GetModelInfo of `target` within `probe_timeout_s`, None when it does not answer (remembers its dtype)."""
        try:
            info = self.stub(target).GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=self.probe_timeout_s)
        except grpc.RpcError:
            return None
        self._dtypes[target] = info.serving_dtype if info.serving_dtype in WIRE_DTYPES else ""
        return info

    def live(self, targets: Sequence[str]) -> list[str]:
        """Those of `targets` that answer a probe now."""
        return list(self.live_versions(targets))

    def live_versions(self, targets: Sequence[str]) -> dict[str, int]:
        """The version each of `targets` that answers a probe now serves (the others left out)."""
        answers = dict(zip(targets, self.pool.map(self.probe, targets), strict=True))
        return {t: int(answer.policy_version.version) for t in targets if (answer := answers[t]) is not None}

    def wire_dtype(self) -> torch.dtype | None:
        """The replicas' common serving dtype (None when they differ or none said: the state goes as it is)."""
        for target in self.targets():
            if target not in self._dtypes:
                self.probe(target)
        wire = {self._dtypes.get(target, "") for target in self.targets()}
        return WIRE_DTYPES.get(wire.pop()) if len(wire) == 1 else None

    def update_request(self, version: int, base: int = 0, **payload: Any) -> inference_pb2.UpdateWeightsRequest:
        """A one-message UpdateWeights of `version` (changed-only against `base`) by this set's writer;
        `payload`: its checkpoint_path or broadcast."""
        return inference_pb2.UpdateWeightsRequest(
            policy_version=version, base_version=base, writer=self.writer, **payload
        )

    def served_version(self) -> int:
        """The oldest version a reachable replica serves (LodestarError when none answers)."""
        return min(served.version for served in self.served_versions().values())

    def served_versions(self) -> dict[str, ServedVersion]:
        """What each reachable replica serves, and who published it (LodestarError when none answers)."""
        served: dict[str, ServedVersion] = {}
        last: LodestarError | None = None
        for target in self.targets():
            try:
                served[target] = self.streamer(target).served()
            except LodestarError as error:
                last = error
        if not served:
            raise last or UnavailableError("no inference replica to ask for its policy version")
        return served

    def submit(self, call: Callable[..., Outcome], targets: Sequence[str], *args: Any) -> dict[str, Future[Outcome]]:
        return {target: self.pool.submit(_outcome, call, target, *args) for target in targets}

    def call_update(
        self, target: str, request: inference_pb2.UpdateWeightsRequest, version: int, nbytes: int, started: float
    ) -> PublishResult:
        """One-message UpdateWeights to `target` with the deadline and retries of a stream push (a timed-out
        attempt that landed after all counts); refusals raise WeightsRefusedError."""
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                reply = self.stub(target).UpdateWeights(iter([request]), timeout=self.timeout_s)
            except grpc.RpcError as error:
                code = status_of(error)
                refused(error, target, version, request.base_version)
                if code not in RETRYABLE:
                    raise domain_error(error, f"UpdateWeights to {target}") from error
                last = f"{code.name}: {details_of(error)}"
                _log.warning("weight push failed, retrying", replica=target, attempt=attempt, error=last)
                if self._landed(target, version):
                    return PublishResult(version, 0, nbytes, time.perf_counter() - started, attempt)
                if attempt < self.attempts:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            seconds = time.perf_counter() - started
            return PublishResult(int(reply.policy_version), int(reply.tensors_updated), nbytes, seconds, attempt)
        raise UnavailableError(
            f"could not push policy version {version} to inference at {target} after {self.attempts} attempts ({last})"
        )

    def call_once(
        self, target: str, request: inference_pb2.UpdateWeightsRequest, version: int, nbytes: int, started: float
    ) -> PublishResult:
        """One UpdateWeights attempt (a broadcast's control call: its fallback is the gRPC stream, not a retry)."""
        try:
            reply = self.stub(target).UpdateWeights(iter([request]), timeout=self.timeout_s)
        except grpc.RpcError as error:
            refused(error, target, version, request.base_version)
            raise domain_error(error, f"UpdateWeights to {target}") from error
        seconds = time.perf_counter() - started
        return PublishResult(int(reply.policy_version), int(reply.tensors_updated), nbytes, seconds, 1)

    def _landed(self, target: str, version: int) -> bool:
        info = self.probe(target)
        return info is not None and int(info.policy_version.version) >= version

    def settle(
        self, version: int, tensors: int, nbytes: int, started: float, outcomes: Mapping[str, Outcome]
    ) -> PublishResult:
        """The push's result from each replica's outcome (see the module docstring for the rules)."""
        for outcome in outcomes.values():
            if isinstance(outcome, WeightsRefusedError):
                raise outcome
        for outcome in outcomes.values():
            if isinstance(outcome, LodestarError) and not isinstance(outcome, UnavailableError):
                raise outcome
        took = [outcome for outcome in outcomes.values() if isinstance(outcome, PublishResult)]
        missed = {target: str(outcome) for target, outcome in outcomes.items() if isinstance(outcome, LodestarError)}
        report_missed(version, bool(took), missed)
        attempts = max(result.attempts for result in took)
        return PublishResult(version, tensors, nbytes, time.perf_counter() - started, attempts)


def refused(error: grpc.RpcError, target: str, version: int, base: int = 0) -> None:
    """Raise WeightsRefusedError when `error` is inference refusing the update (INVALID_ARGUMENT: names,
    shapes, dtypes, version; PERMISSION_DENIED: a checkpoint_path outside its --checkpoint-dirs), and
    StaleBaseError when it refuses a changed-only update against `base` (FAILED_PRECONDITION)."""
    code = status_of(error)
    if code == grpc.StatusCode.FAILED_PRECONDITION and base:
        raise StaleBaseError(f"inference at {target}: {details_of(error)}") from error
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
        raise WeightsRefusedError(
            f"inference at {target} refused the weights of policy version {version}: {details_of(error)}"
        ) from error


def collect(futures: Mapping[str, Future[Outcome]]) -> dict[str, Outcome]:
    return {target: future.result() for target, future in futures.items()}


def _outcome(call: Callable[..., Outcome], target: str, *args: Any) -> Outcome:
    """`call(target, *args)`, a domain error returned instead of raised (the caller weighs every replica's)."""
    try:
        return call(target, *args)
    except LodestarError as error:
        return error


class ReplicaSetPublisher:
    """What every publisher over a `ReplicaSet` shares (shared_fs.py, broadcast.py): its targets, the version
    the replicas serve, and the payload in their serving dtype. A subclass sets `replicas` and moves the bytes
    in `publish` (shared_fs), or also derives from PayloadPublisher and moves the serialized payload in
    `publish_payload` (broadcast)."""

    replicas: ReplicaSet

    @property
    def target(self) -> str:
        return ",".join(self.replicas.targets())

    def close(self) -> None:
        self.replicas.close()

    @property
    def writer(self) -> str:
        return self.replicas.writer

    def served_version(self) -> int:
        return self.replicas.served_version()

    def served_versions(self) -> dict[str, ServedVersion]:
        return self.replicas.served_versions()

    def payload_dtype(self) -> torch.dtype | None:
        """The replicas' common serving dtype (None: the state goes as it is)."""
        return self.replicas.wire_dtype()
