"""A small in-process RolloutService stand-in on a real gRPC server (port 0) that records what nodes send.

Tests queue assignments (`offer`), read every AcquireSessions request (`acquires`) and every result
(`results`), inject cancellations (`cancel`) and CompleteSession failures (`fail_next_completes`,
`fence`). It is a sync grpc server on its own threads, so it works next to any event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from tests.waiting import wait_until


class RolloutStandIn(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: list[rollout_pb2.SessionAssignment] = []
        self.acquires: list[rollout_pb2.AcquireSessionsRequest] = []
        self.results: list[rollout_pb2.SessionResult] = []
        self.complete_calls = 0
        self._cancel: list[rollout_pb2.SessionAttemptRef] = []
        self._failures: list[grpc.StatusCode] = []
        self._fenced: set[tuple[str, int]] = set()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    # Test controls ---------------------------------------------------------------------------------

    def offer(self, *assignments: rollout_pb2.SessionAssignment) -> None:
        with self._lock:
            self.pending.extend(assignments)

    def cancel(self, session_id: str, attempt: int = 1) -> None:
        with self._lock:
            self._cancel.append(rollout_pb2.SessionAttemptRef(session_id=session_id, attempt=attempt))

    def fail_next_completes(self, *codes: grpc.StatusCode) -> None:
        with self._lock:
            self._failures.extend(codes)

    def fence(self, session_id: str, attempt: int = 1) -> None:
        with self._lock:
            self._fenced.add((session_id, attempt))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
        try:
            wait_until(predicate, timeout, what=what)
        except AssertionError as error:
            raise AssertionError(f"{error}; results={[self.describe(r) for r in self.results]}") from None

    def wait_results(self, count: int, timeout: float = 60.0) -> list[rollout_pb2.SessionResult]:
        self.wait_for(lambda: len(self.results) >= count, timeout, f"{count} results")
        return list(self.results)

    def result(self, session_id: str) -> rollout_pb2.SessionResult:
        return next(r for r in self.results if r.session_id == session_id)

    def stages_seen(self, session_id: str) -> list[int]:
        """The stages a node reported for `session_id`, in order, without repeats."""
        seen: list[int] = []
        for request in list(self.acquires):
            for progress in request.in_flight:
                if progress.session_id == session_id and (not seen or seen[-1] != progress.stage):
                    seen.append(progress.stage)
        return seen

    @staticmethod
    def describe(result: rollout_pb2.SessionResult) -> str:
        outcome = rollout_pb2.SessionOutcome.Name(result.outcome)
        return f"{result.session_id}:{outcome}:{result.reward}:{result.error!r}:calls={len(result.calls)}"

    # RPCs ------------------------------------------------------------------------------------------

    def AcquireSessions(self, request: rollout_pb2.AcquireSessionsRequest, context: Any) -> Any:
        with self._lock:
            self.acquires.append(request)
            given, self.pending = self.pending[: request.free_slots], self.pending[request.free_slots :]
            held = {(p.session_id, p.attempt) for p in request.in_flight}
            cancel = [ref for ref in self._cancel if (ref.session_id, ref.attempt) in held]
            self._cancel = [ref for ref in self._cancel if ref not in cancel]
        return rollout_pb2.AcquireSessionsResponse(sessions=given, cancelled=cancel)

    def CompleteSession(self, request: rollout_pb2.CompleteSessionRequest, context: Any) -> Any:
        with self._lock:
            self.complete_calls += 1
            code = self._failures.pop(0) if self._failures else None
            fenced = (request.result.session_id, request.result.attempt) in self._fenced
        if code is not None:
            context.abort(code, "stand-in failure")
        if fenced:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "attempt superseded")
        with self._lock:
            self.results.append(request.result)
        return rollout_pb2.CompleteSessionResponse(counted=True)

    # Lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(0)

    @classmethod
    def running(cls) -> Iterator[RolloutStandIn]:
        standin = cls()
        standin.start()
        try:
            yield standin
        finally:
            standin.stop()


def assignment(
    session_id: str,
    *,
    command: list[str],
    prompt: str = "do the task",
    verifier: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    agent_timeout_s: int = 60,
    session_timeout_s: int = 120,
    attempt: int = 1,
    task_id: str = "task-1",
    run_id: str = "run-1",
    env: dict[str, str] | None = None,
) -> rollout_pb2.SessionAssignment:
    spec = verifier or {"kind": "command", "config": {"command": "true"}}
    message = rollout_pb2.SessionAssignment(
        session_id=session_id,
        run_id=run_id,
        group_id=f"{run_id}/{task_id}",
        attempt=attempt,
        task=rollout_pb2.Task(task_id=task_id, prompt=prompt, files=files or {}),
        harness=rollout_pb2.HarnessSpec(kind="command", command=command, model="lodestar-tiny", env=env or {}),
        verifier=rollout_pb2.VerifierSpec(kind=spec["kind"]),
    )
    message.verifier.config.update(spec.get("config", {}))
    if metadata:
        message.task.metadata.update(metadata)
    message.agent_timeout.FromSeconds(agent_timeout_s)
    message.session_timeout.FromSeconds(session_timeout_s)
    return message
