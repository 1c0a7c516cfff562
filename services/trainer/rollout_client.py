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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from lodestar.errors import UnavailableError
from lodestar.grpc.client import leader_from_error
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from services.trainer.rpc import RETRYABLE, details_of, domain_error, status_of, sync_channel

_log = get_logger("trainer.rollout")

MAX_BACKOFF_S = 10.0


class RolloutClient:
    """See the module docstring."""

    def __init__(self, target: str, run_id: str, *, rpc_timeout_s: float = 30.0, reconnect_s: float = 600.0) -> None:
        self.target = target
        self.run_id = run_id
        self._rpc_timeout_s = rpc_timeout_s
        self._reconnect_s = reconnect_s
        self._channel = sync_channel(target)
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
        old, self.target = self._channel, leader
        self._channel = sync_channel(leader)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        old.close()
        return True

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
            call = self._stub.StreamGroups(request, wait_for_ready=True)
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
        """Tell rollout which version inference serves now (retried on UNAVAILABLE, following the leader)."""
        request = rollout_pb2.ReportPolicyVersionRequest(policy_version=version)
        for attempt in (1, 2, 3):
            try:
                self._stub.ReportPolicyVersion(request, timeout=self._rpc_timeout_s)
                return
            except grpc.RpcError as error:
                if self._follow_leader(error):
                    continue
                if attempt == 3 or status_of(error) not in RETRYABLE:
                    raise domain_error(error, f"ReportPolicyVersion to {self.target}") from error
                time.sleep(0.5)
