"""A weight push that overlaps the next step (`async_push`): at most one policy version in flight.

With a synchronous push the trainer waits, every step, for inference to receive, validate and swap in the new
weights before it reads its next groups. `BackgroundPush` takes the step's state and pushes it from a worker
thread while the trainer trains its next step. What the trainer's thread still does is one copy: when the
state is the model's own memory (a single process: the next optimizer step changes it in place), `Snapshot`
copies it, cast to the payload dtype, into buffers allocated once and reused every step (a memcpy into memory
already mapped, far cheaper than serializing, which the worker now does: docs/benchmarks.md);
a gathered or offloaded state (torchrun, CUDA) is already a private copy and is handed over as it is. Rollout
hears the new version (`on_served`) only once every replica serves it. Before a second version is sent the
first must have landed (`submit` waits for it): one version in flight, so sampling is at most one more version
behind than with a synchronous push, and the wait is what `push_wait_s` reports. An error of the push (a
refusal, no replica reachable) is raised in the trainer's thread by the next `submit` or `wait`: the trainer
then fails as it would have one step earlier.

With `weights.changed_only` the publisher is a `ChangedOnlyPublisher` (weights/changes.py): the trainer's
thread then compares the state with the mirror of the last version and copies only what changed into it (the
mirror takes the snapshot's place: no second copy), and the worker sends the Delta.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor

from lodestar.logging import get_logger
from lodestar_trainer.settings import WeightsSettings
from lodestar_trainer.weights.changes import Delta, Mirror
from lodestar_trainer.weights.publish import PublishResult, ServedVersion

_log = get_logger("trainer.push")


class StatePublisher(Protocol):
    def payload_dtype(self) -> torch.dtype | None: ...
    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult: ...


class Snapshot:
    """A copy of a state in buffers that live from one push to the next (allocated on first use, or when a
    tensor's shape or dtype changes)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        """`state` copied, its floating-point tensors cast to `dtype` when given. The tensors returned are
        overwritten by the next `take`."""
        taken: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, tensor in state.items():
                want = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                buffer = self._buffers.get(name)
                if buffer is None or buffer.shape != tensor.shape or buffer.dtype != want:
                    buffer = self._buffers[name] = torch.empty(tensor.shape, dtype=want, device="cpu")
                taken[name] = buffer.copy_(tensor)
        return taken


def shares_memory(state: Mapping[str, torch.Tensor], model: torch.nn.Module) -> bool:
    """Whether a tensor of `state` is the memory of one of `model`'s parameters or buffers."""
    own = {_storage(tensor) for tensor in chain(model.parameters(), model.buffers())}
    return any(_storage(tensor) in own for tensor in state.values())


def _storage(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage().data_ptr()


def payload_bytes(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> int:
    """The tensor bytes of `state`'s payload in `dtype` (the safetensors header aside)."""
    return sum(
        t.numel() * (dtype.itemsize if dtype is not None and t.is_floating_point() else t.element_size())
        for t in state.values()
    )


class BackgroundPush:
    """Pushes versions from one worker thread, one at a time (see the module docstring)."""

    def __init__(self, publisher: StatePublisher, on_served: Callable[[int], None]) -> None:
        self._publisher = publisher
        self._on_served = on_served
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-push")
        self._pending: Future[PublishResult] | None = None
        self._snapshot = Snapshot()
        self.last: PublishResult | None = None
        """The latest push that completed."""

    def submit(self, state: Mapping[str, torch.Tensor], version: int, *, copy: bool = True) -> tuple[int, float]:
        """Wait for the push in flight (raising its error), then start pushing `state` as `version`; `copy`:
        `state` may change once this returns (it is the model's memory), so push a snapshot of it. Returns
        (payload tensor bytes, seconds waited for the previous push)."""
        waited = self.wait()
        if isinstance(self._publisher, ChangedOnlyPublisher):
            delta = self._publisher.take(state, version)  # a copy into the mirror, whatever `copy` says
            self._pending = self._pool.submit(self._send, self._publisher, delta)
            return delta.diff_bytes, waited
        dtype = self._publisher.payload_dtype()
        pushed = self._snapshot.take(state, dtype) if copy else dict(state)
        self._pending = self._pool.submit(self._push, pushed, version)
        return payload_bytes(pushed, dtype), waited

    def wait(self) -> float:
        """Block until the push in flight is done (re-raising its error); the seconds waited."""
        pending, self._pending = self._pending, None
        if pending is None:
            return 0.0
        started = time.perf_counter()
        self.last = pending.result()
        return time.perf_counter() - started

    def close(self) -> None:
        """Finish the push in flight (errors logged: the trainer is stopping) and stop the worker."""
        try:
            self.wait()
        except Exception as error:
            _log.error("the last weight push failed", error=str(error))
        self._pool.shutdown(wait=True)

    def _send(self, publisher: ChangedOnlyPublisher, delta: Delta) -> PublishResult:
        result = publisher.send(delta)  # logs the push
        self._on_served(delta.version)
        return result

    def _push(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
        result = push(self._publisher, state, version)
        self._on_served(version)
        return result


def push(publisher: StatePublisher, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
    """Publish `state` as `version` and log the push once, with its `seconds` (bench/chaos_checks.py reads when
    each push began from it): a changed-only publisher logs its own line, any other gets "weights pushed"."""
    result = publisher.publish(state, version)
    if not isinstance(publisher, ChangedOnlyPublisher):
        _log.info(
            "weights pushed",
            policy_version=version,
            seconds=round(result.seconds, 3),
            payload_bytes=result.payload_bytes,
        )
    return result


class DeltaPublisher(Protocol):
    """A transport that can push a Delta (publish.py, shared_fs.py, broadcast.py)."""

    def payload_dtype(self) -> torch.dtype | None: ...
    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult: ...
    def publish_delta(self, delta: Delta) -> PublishResult: ...
    def served_version(self) -> int: ...
    def served_versions(self) -> dict[str, ServedVersion]: ...
    @property
    def writer(self) -> str: ...
    def close(self) -> None: ...


class ChangedOnlyPublisher:
    """A transport's publisher that sends changed-only versions (`weights.changed_only`). `take` (the trainer's
    thread: the state may change once it returns) and `send` (any thread) split `publish` for async_push."""

    def __init__(self, inner: DeltaPublisher) -> None:
        self.inner = inner
        self.mirror = Mirror()

    @property
    def target(self) -> str:
        return str(getattr(self.inner, "target", ""))

    def payload_dtype(self) -> torch.dtype | None:
        return self.inner.payload_dtype()

    @property
    def writer(self) -> str:
        return self.inner.writer

    def served_version(self) -> int:
        return self.inner.served_version()

    def served_versions(self) -> dict[str, ServedVersion]:
        return self.inner.served_versions()

    def close(self) -> None:
        self.inner.close()

    def take(self, state: Mapping[str, torch.Tensor], version: int) -> Delta:
        return self.mirror.take(state, self.payload_dtype(), version)

    def send(self, delta: Delta) -> PublishResult:
        """Push `delta`; its version becomes the next diff's base once it landed (see the module docstring)."""
        result = self.inner.publish_delta(delta)
        self.mirror.confirm(delta.version)
        _log.info(
            "weights pushed (changed only)",
            policy_version=delta.version,
            base_version=delta.base,
            tensors_changed=len(delta.changed) if delta.base else len(delta.state),
            tensors=len(delta.state),
            payload_bytes=result.payload_bytes,
            full_bytes=result.full_bytes,
            full_replicas=list(result.full_replicas),
            seconds=round(result.seconds, 3),
        )
        return result

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
        return self.send(self.take(state, version))


def changed_only(settings: WeightsSettings, publisher: Any) -> Any:
    """`publisher` as a ChangedOnlyPublisher when `weights.changed_only` is on (None stays None)."""
    if publisher is None or not settings.changed_only:
        return publisher
    return ChangedOnlyPublisher(publisher)
