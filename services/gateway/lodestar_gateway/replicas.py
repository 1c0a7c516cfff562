"""Several inference replicas behind one gateway: session affinity, failover, replicas that come and go.

`ReplicaSet` is the gateway's InferenceBackend when `--inference` names more than one address (or when
`--inference-discovery etcd` finds replicas in etcd, `lodestar_gateway/replica_watch.py`). Each replica has its
own channel and GenerateMany stream (`GrpcInference`). A call goes to the replica `AffinityRouter` picks for its
session (`GenerateRequest.session_id`): every call of a session lands on one replica while that replica lives and
has room, so its prefix cache serves the session's earlier turns.

Failover. A replica that fails a call with UNAVAILABLE (its own client already retried for ~1.5 s) is set
aside for `down_s`. If it failed before the first event, the call goes to the next replica at once, and
the harness never sees the failure: the call is the same tokens on any replica (the gateway sends the
session's earlier token ids as the continuation, so the prompt is token-faithful wherever it runs). A call
cut after it streamed tokens is not restarted elsewhere (its tokens were already sent to the harness): it
fails as a retryable 503/529 and the harness's retry lands on another replica. Replicas set aside are
tried again after `down_s`, or at once when every replica is set aside.

Version floors. Every call carries `min_policy_version`: the newest version this gateway has seen its replica
serve (its answers, and its etcd record with discovery) since that replica's process joined. A replica killed
and restarted at the same address comes back with its starting weights, and the gateway may not have seen it
leave (its etcd key outlives it by a lease TTL); its floor then makes it refuse the session's next call
(UNAVAILABLE, before sampling), which fails over as above instead of sampling from a policy the run left
behind. Discovery resets a replica's floor to its record's version when a new process registers at the
address (`served(..., incarnation=)`), so a fleet restarted as a whole serves again. Replicas named by
static addresses (`--inference a,b`) have no floor (0): nothing tells the gateway which process answers.

No replica routed. While the set is empty (discovery holds every live replica back until one serves the
fleet's version, or none has registered yet) a call waits up to `hold_s` for one to be added, then fails
as UNAVAILABLE: a replica that paused past its lease is back, or caught up, within seconds, and a call held
that long costs the harness less than a 503 it may give up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

from lodestar.errors import UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2
from lodestar_gateway.inference_client import GrpcInference
from lodestar_gateway.routing import DEFAULT_LOAD_FACTOR, AffinityRouter

_log = get_logger("gateway.replicas")
DOWN_S = 5.0
HOLD_S = 30.0
"""How long a call waits for a replica while none is routed (see the module docstring)."""


class ReplicaSet:
    """InferenceBackend over several replicas (see the module docstring)."""

    def __init__(
        self,
        targets: Iterable[str],
        *,
        timeout_s: float = 600.0,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        down_s: float = DOWN_S,
        hold_s: float = HOLD_S,
    ) -> None:
        self._timeout_s = timeout_s
        self._down_s = down_s
        self._hold_s = hold_s
        self._added = asyncio.Event()
        self.held = 0
        """Calls that waited for a replica because none was routed (for status and tests)."""
        self.router = AffinityRouter(load_factor=load_factor)
        self.clients: dict[str, GrpcInference] = {}
        self._down_until: dict[str, float] = {}
        self._inflight: dict[str, int] = {}
        self._leaving: dict[str, GrpcInference] = {}
        """Removed replicas whose calls in flight have not ended yet."""
        self.failovers = 0
        """Calls moved to another replica before their first token (for status and tests)."""
        self.floors: dict[str, int] = {}
        """Per replica, the oldest policy version its calls accept (see the module docstring)."""
        self._incarnations: dict[str, int] = {}
        for target in targets:
            self.add(target)

    @property
    def target(self) -> str:
        return ",".join(self.router.replicas)

    def add(self, target: str) -> None:
        """A replica joins; sessions of its ring arcs move to it from their next call."""
        if target not in self.clients:
            self.clients[target] = GrpcInference(target, timeout_s=self._timeout_s)
            self.router.add(target)
            self._added.set()
            _log.info("inference replica added", replica=target, replicas=len(self.clients))

    def served(self, target: str, version: int, *, incarnation: int | None = None) -> None:
        """`target` serves `version` (an answer said so, or its etcd record): its calls' floor rises to it. An
        `incarnation` (the registration's lease) other than the last one seen is a new process at the
        address: its floor starts again from `version`. Only replicas whose incarnation is known (discovery)
        have a floor: a static address says nothing of which process answers it, and a floor that no
        restarted process could meet before the next push would stall a run whose every replica restarted."""
        if incarnation is not None and self._incarnations.get(target) != incarnation:
            if target in self._incarnations:
                _log.info("inference replica restarted", replica=target, policy_version=version)
            self._incarnations[target] = incarnation
            self.floors[target] = version
        elif target in self._incarnations:
            self.floors[target] = max(self.floors[target], version)

    async def remove(self, target: str) -> None:
        """A replica leaves: no call is placed on it any more; its calls in flight finish (a draining replica
        ends them) or fail on their own, and its channel closes after the last."""
        client = self.clients.pop(target, None)
        self.router.remove(target)
        self._down_until.pop(target, None)
        self.floors.pop(target, None)
        self._incarnations.pop(target, None)
        if client is not None:
            _log.info("inference replica removed", replica=target, replicas=len(self.clients))
            if self._inflight.get(target, 0):
                self._leaving[target] = client
            else:
                await client.close()

    async def close(self) -> None:
        for client in [*self.clients.values(), *self._leaving.values()]:
            await client.close()
        self.clients.clear()
        self._leaving.clear()

    def _set_aside(self) -> set[str]:
        now = time.monotonic()
        down = {target for target, until in self._down_until.items() if until > now}
        return down if len(down) < len(self.clients) else set()

    async def _routed(self) -> None:
        """Wait up to `hold_s` while no replica is routed at all."""
        if self.clients:
            return
        self.held += 1
        deadline = time.monotonic() + self._hold_s
        while not self.clients and (left := deadline - time.monotonic()) > 0:
            self._added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), left)

    def _pick(self, key: str, failed: set[str]) -> str:
        replica = self.router.pick(key, exclude=failed | self._set_aside())
        if replica is None:
            raise UnavailableError(
                f"no inference replica could serve the call (tried {len(failed)} of {len(self.clients)})"
            )
        return replica

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        key = request.session_id or request.request_id
        failed: set[str] = set()
        await self._routed()
        while True:
            replica = self._pick(key, failed)
            client, streamed = self.clients[replica], False
            self.router.started(replica)
            self._inflight[replica] = self._inflight.get(replica, 0) + 1
            attempt = inference_pb2.GenerateRequest()  # a copy: the caller's request is read on the store's thread
            attempt.CopyFrom(request)
            attempt.min_policy_version = self.floors.get(replica, 0)
            incarnation = self._incarnations.get(replica)
            try:
                async for response in client.generate(attempt):
                    streamed = True
                    if response.HasField("final") and self._incarnations.get(replica) == incarnation:
                        # (an answer of a process replaced while it ran, e.g. draining, says nothing of the new one)
                        self.served(replica, response.final.policy_version)
                    yield response
                return
            except UnavailableError as error:
                self._down_until[replica] = time.monotonic() + self._down_s
                failed.add(replica)
                if streamed:
                    raise
                self.failovers += 1
                _log.warning(
                    "inference replica failed a call before its first token; trying another",
                    replica=replica,
                    session_id=request.session_id,
                    error=error.message,
                )
            finally:
                self.router.finished(replica)
                await self._ended(replica)

    async def _ended(self, replica: str) -> None:
        left = self._inflight[replica] = self._inflight[replica] - 1
        if not left:
            del self._inflight[replica]
            if (client := self._leaving.pop(replica, None)) is not None:
                await client.close()

    async def count_tokens(self, request: inference_pb2.CountTokensRequest) -> int:
        await self._routed()
        return await self.clients[self._pick("count-tokens", set())].count_tokens(request)

    async def model_info(self) -> inference_pb2.GetModelInfoResponse:
        """The model info of a live replica (every replica serves the same model)."""
        failed: set[str] = set()
        await self._routed()
        while True:
            replica = self._pick("model-info", failed)
            try:
                return await self.clients[replica].model_info()
            except UnavailableError:
                self._down_until[replica] = time.monotonic() + self._down_s
                failed.add(replica)
