"""RolloutService client of the training thread: the run's groups as an iterator, and policy-version reports.

`RolloutClient.groups(start_after)` yields the run's groups one by one, each read by its own
`StreamGroups(run, start_after, tokens_only=true, max_groups=1)` when the loop asks for it: no group waits
in a transport buffer while a step runs (it would go stale there, unseen by rollout's staleness check, and
rollout would count it as consumed and race ahead). Waiting for the next group has no deadline (sessions
take minutes); a stream that breaks with UNAVAILABLE is reopened after `start_after + groups already
yielded` with backoff, so no group is read twice or skipped. A stream that ends without a group means the
run has no more groups. `cancel()`
(from any thread) ends a blocked read: the iterator stops. A follower rollout instance answers UNAVAILABLE
naming the leader (`lodestar-leader` trailing metadata): both calls move to the leader and carry on.

The target may list a leader and its standbys ("a:50053,b:50053", as gateway nodes take it). With one address
a read waits for it to be ready (a restarting rollout comes back there). With several, a call fails fast on
an address that does not answer and the client moves to the next one, so the trainer follows a failover to a
standby on another host even when the dead leader's address never answers again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from lodestar.errors import UnavailableError
from lodestar.grpc.client import leader_from_error, split_targets
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_trainer.rpc import RETRYABLE, details_of, domain_error, status_of, sync_channel

_log = get_logger("trainer.rollout")

MAX_BACKOFF_S = 10.0


class RolloutClient:
    """See the module docstring."""

    def __init__(self, target: str, run_id: str, *, rpc_timeout_s: float = 30.0, reconnect_s: float = 600.0) -> None:
        self.targets = split_targets(target)
        if not self.targets:
            raise ValueError(f"no rollout address in {target!r}")
        self.target = self.targets[0]
        self._next = 1
        self.run_id = run_id
        self._rpc_timeout_s = rpc_timeout_s
        self._reconnect_s = reconnect_s
        self._channel = sync_channel(self.target)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        self._lock = threading.Lock()
        self._call: Any = None
        self._cancelled = threading.Event()

    def _follow_leader(self, error: grpc.RpcError) -> bool:
        """Move to the leader a follower named in `error`; False when it named none (or this one)."""
        leader = leader_from_error(error) if isinstance(error, grpc.Call) else None
        if leader is None or leader == self.target:
            return False
        _log.info("following the rollout leader", previous=self.target, leader=leader)
        self._connect(leader)
        return True

    def _try_next(self, error: grpc.RpcError) -> bool:
        """Move to the next listed address after `error` left this one unanswered; False with one address."""
        if len(self.targets) < 2 or status_of(error) != grpc.StatusCode.UNAVAILABLE:
            return False
        target = self.targets[self._next % len(self.targets)]
        self._next += 1
        _log.info("rollout unavailable, trying the next address", previous=self.target, next=target)
        self._connect(target)
        return True

    def _connect(self, target: str) -> None:
        old, self.target = self._channel, target
        self._channel = sync_channel(target)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        old.close()

    def close(self) -> None:
        self.cancel()
        self._channel.close()

    def cancel(self) -> None:
        """End `groups()` now (a read blocked in it returns)."""
        self._cancelled.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]:
        """The run's groups after the first `start_after` (see the module docstring)."""
        delivered = start_after
        backoff = 0.2
        failing_since: float | None = None
        while not self._cancelled.is_set():
            request = rollout_pb2.StreamGroupsRequest(
                run_id=self.run_id, start_after=delivered, tokens_only=True, max_groups=1
            )
            call = self._stub.StreamGroups(request, wait_for_ready=len(self.targets) == 1)
            with self._lock:
                self._call = call
            if self._cancelled.is_set():
                call.cancel()
            try:
                received = 0
                for response in call:  # one group (more from a rollout that ignores max_groups)
                    failing_since, backoff = None, 0.2
                    delivered += 1
                    received += 1
                    yield response.group
                if not received:
                    return
            except grpc.RpcError as error:
                if self._cancelled.is_set() or status_of(error) == grpc.StatusCode.CANCELLED:
                    return
                if self._follow_leader(error):
                    continue
                if status_of(error) not in RETRYABLE:
                    raise domain_error(error, f"StreamGroups from {self.target}") from error
                self._try_next(error)
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self._reconnect_s:
                    raise UnavailableError(
                        f"StreamGroups from {self.target} kept failing for {self._reconnect_s:.0f} s: "
                        f"{details_of(error)}"
                    ) from error
                _log.warning("group stream broke, reconnecting", delivered=delivered, error=details_of(error))
                self._cancelled.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            finally:
                with self._lock:
                    self._call = None

    def report_policy_version(self, version: int) -> None:
        """Tell rollout which version inference serves now: retried on UNAVAILABLE with backoff for up to
        `reconnect_s` (a failover to a standby takes the leader's lease TTL), following the leader."""
        request = rollout_pb2.ReportPolicyVersionRequest(policy_version=version)
        backoff = 0.5
        deadline = time.monotonic() + self._reconnect_s
        while True:
            try:
                self._stub.ReportPolicyVersion(request, timeout=self._rpc_timeout_s)
                return
            except grpc.RpcError as error:
                if self._follow_leader(error):
                    continue
                if status_of(error) not in RETRYABLE or time.monotonic() > deadline:
                    raise domain_error(error, f"ReportPolicyVersion to {self.target}") from error
                self._try_next(error)
                _log.warning("policy version report failed, retrying", version=version, error=details_of(error))
                if self._cancelled.wait(backoff):
                    raise domain_error(error, f"ReportPolicyVersion to {self.target}") from error
                backoff = min(backoff * 2, MAX_BACKOFF_S)
