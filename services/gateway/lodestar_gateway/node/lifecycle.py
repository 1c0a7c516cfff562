"""The node lifecycle: pull sessions from rollout and run each INIT -> READY -> RUN -> POST -> report.

Scheduling. The node polls `AcquireSessions` every `poll_interval_s`, and at once whenever a run slot
frees, asking for `slots + ready_buffer - (attempts in INIT, READY or RUN)` sessions (0 when full or
stopping: the poll still reports every attempt it holds with its stage, and collects cancellations). It
acquires only while registered in etcd (ownership keys are bound to its lease).

Stages. Each attempt is one task passing through three bounded pools: `init_workers` concurrent INITs
(runtime + gateway session), `slots` concurrent RUNs (the harness), `post_workers` concurrent POSTs
(collect calls, verifier). Prepared attempts waiting for a run slot are the READY buffer; READY time counts
against neither the agent nor the session timeout. The session timeout bounds INIT + RUN (the harness gets
min(agent_timeout, what is left)); POST is bounded by the verifier's own timeout. A harness cut at its
limit keeps its captured calls and is scored by the verifier (TIMED_OUT). Results are reported with
bounded retries (`rollout_client.complete_with_retries`); a fenced result is dropped.

Stopping. A cancellation from rollout kills the attempt (process group), and it is reported CANCELLED.
`stop()` (SIGTERM of the node) is a drain, not a failure: the node takes no new work (it keeps polling, so
rollout still sees its attempts and can cancel them), hands back at once every attempt whose harness has
not started (INIT, READY), lets running and verifying ones finish for up to `drain_grace_s`, then kills
what is left; every attempt it did not finish is reported CANCELLED ("node draining", with the calls
captured so far), which rollout requeues at once without spending one of the session's `max_attempts`, so
a rolling restart of every node costs no session an attempt. Reports are bounded by
`shutdown_timeout_s`; if rollout cannot be reached, the lease revoke that follows (the node leaving etcd)
or its expiry requeues them (then as lost attempts, which count). Every exit path closes the gateway
session, kills the harness's process group and removes the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from lodestar.errors import LodestarError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.attempt import STAGE_NAMES, Attempt, AttemptKey, OutcomeCode
from lodestar_gateway.node.rollout_client import RetryPolicy, RolloutLink, complete_with_retries
from lodestar_gateway.node.stages import Outcome, SessionStages, infra
from lodestar_gateway.retention import Retention

_log = get_logger("gateway.node.lifecycle")
LOG_TAIL_CHARS = 1500
"""How much of a harness's stdout and of its stderr the log line of an infrastructure failure keeps."""
_RUN_STAGES = (rollout_pb2.SESSION_STAGE_INIT, rollout_pb2.SESSION_STAGE_READY, rollout_pb2.SESSION_STAGE_RUN)
_NOT_STARTED = (rollout_pb2.SESSION_STAGE_UNSPECIFIED, rollout_pb2.SESSION_STAGE_INIT, rollout_pb2.SESSION_STAGE_READY)
DRAINING = "node draining"
_ACKNOWLEDGED = ("counted", "not_counted", "fenced")
"""Report statuses after which rollout needs nothing more of the attempt's calls (a fenced attempt's are
superseded)."""


@dataclass(frozen=True)
class LifecycleConfig:
    slots: int = 4
    ready_buffer: int = 2
    init_workers: int = 2
    post_workers: int = 2
    poll_interval_s: float = 1.0
    default_session_timeout_s: float = 3600.0
    default_agent_timeout_s: float = 1800.0
    report: RetryPolicy = field(default_factory=RetryPolicy)
    shutdown_timeout_s: float = 15.0
    drain_grace_s: float = 0.0
    """On stop, how long attempts whose harness runs or whose verifier scores may go on before they are
    handed back (0: hand every attempt back at once)."""


class NodeLifecycle:
    """Runs the sessions rollout hands this node (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        rollout: RolloutLink,
        stages: SessionStages,
        lease_id: Callable[[], int | None],
        config: LifecycleConfig,
        retention: Retention | None = None,
    ) -> None:
        """`retention`: told of each reported attempt's gateway session, which then leaves the capture store
        after its retention window (None: captured sessions are kept)."""
        self.node_id = node_id
        self.config = config
        self._rollout = rollout
        self._stages = stages
        self._retention = retention
        self._lease_id = lease_id
        self._attempts: dict[AttemptKey, Attempt] = {}
        self._tasks: dict[AttemptKey, asyncio.Task[None]] = {}
        self._init_pool = asyncio.Semaphore(config.init_workers)
        self._run_slots = asyncio.Semaphore(config.slots)
        self._post_pool = asyncio.Semaphore(config.post_workers)
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._stopping = False
        self._polling = True
        self.outcomes: dict[str, int] = {}
        """How attempts ended here, by outcome name (for status and tests)."""

    # Status --------------------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.config.slots

    def stage_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STAGE_NAMES.values(), 0)
        for attempt in self._attempts.values():
            counts[STAGE_NAMES[attempt.stage]] += 1
        return counts

    def attempts(self) -> list[Attempt]:
        return list(self._attempts.values())

    def free_slots(self) -> int:
        if self._stopping:
            return 0
        busy = sum(1 for attempt in self._attempts.values() if attempt.stage in _RUN_STAGES)
        return max(0, self.config.slots + self.config.ready_buffer - busy)

    # Polling -------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_loop(), name=f"lifecycle-{self.node_id}")

    async def _poll_loop(self) -> None:
        failures = 0
        while self._polling:  # through the drain too: its polls report the attempts still running
            lease = self._lease_id()
            if lease is not None:
                try:
                    await self.poll_once(lease)
                    failures = 0
                except LodestarError as error:
                    failures += 1
                    log = _log.warning if failures == 1 or failures % 30 == 0 else _log.debug
                    log("AcquireSessions failed", error=error.message, failures=failures)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.poll_interval_s)

    async def poll_once(self, lease_id: int) -> int:
        """One AcquireSessions round trip: report progress, apply cancellations, start new attempts.
        Returns how many attempts were started."""
        in_flight = [attempt.progress() for attempt in self._attempts.values()]
        acquired = await self._rollout.acquire(self.node_id, lease_id, self.free_slots(), in_flight)
        for ref in acquired.cancelled:
            self.cancel((ref.session_id, ref.attempt), "cancelled by rollout")
        started = 0
        for assignment in acquired.sessions:
            if self._stopping:
                break
            started += self._start_attempt(assignment)
        return started

    def _start_attempt(self, assignment: rollout_pb2.SessionAssignment) -> int:
        attempt = Attempt(assignment)
        if attempt.key in self._attempts:
            return 0
        self._attempts[attempt.key] = attempt
        self._tasks[attempt.key] = asyncio.create_task(self._drive(attempt), name=f"attempt-{attempt.name}")
        _log.info(
            "session acquired",
            session_id=assignment.session_id,
            attempt=assignment.attempt,
            run_id=assignment.run_id,
            task_id=assignment.task.task_id,
        )
        return 1

    def cancel(
        self, key: AttemptKey, reason: str, outcome: OutcomeCode = rollout_pb2.SESSION_OUTCOME_CANCELLED
    ) -> bool:
        """Stop an attempt now (its process group is killed); it is reported with `outcome`."""
        attempt, task = self._attempts.get(key), self._tasks.get(key)
        if attempt is None or task is None or attempt.stop_reason is not None or attempt.finishing or task.done():
            return False
        attempt.stop_reason, attempt.stop_outcome = reason, outcome
        task.cancel(reason)
        return True

    # One attempt ---------------------------------------------------------------------------------------

    async def _drive(self, attempt: Attempt) -> None:
        key = attempt.key
        try:
            try:
                outcome = await self._pipeline(attempt)
                attempt.finishing = True
            except asyncio.CancelledError:
                if attempt.stop_reason is None:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                await self._stages.collect(attempt)
                outcome = Outcome(attempt.stop_outcome, error=attempt.stop_reason)
            except Exception as error:  # a bug must not leak the attempt: report it as infrastructure
                _log.exception("attempt failed unexpectedly", session_id=key[0], attempt=key[1])
                with contextlib.suppress(Exception):
                    await self._stages.collect(attempt)
                outcome = infra(f"node error: {type(error).__name__}")
            finally:
                attempt.finishing = True
                await self._stages.release(attempt)
            status = await self._report(attempt, outcome)
            if self._retention is not None and attempt.gateway_session_id:
                try:
                    await self._retention.reported(attempt.gateway_session_id, acknowledged=status in _ACKNOWLEDGED)
                except Exception as error:  # the session then stays in the store: disk, never correctness
                    _log.warning("could not schedule a captured session's deletion", error=str(error))
        finally:
            self._attempts.pop(key, None)
            self._tasks.pop(key, None)
            self._wake.set()

    async def _pipeline(self, attempt: Attempt) -> Outcome:
        assignment = attempt.assignment
        session_limit = _seconds(assignment.session_timeout) or self.config.default_session_timeout_s
        agent_limit = _seconds(assignment.agent_timeout) or self.config.default_agent_timeout_s
        async with self._init_pool:
            try:
                async with asyncio.timeout(session_limit):
                    await self._stages.init(attempt)
            except TimeoutError:
                return infra(f"session timeout ({session_limit:g} s) during INIT")
            except (LodestarError, OSError) as error:
                return infra(f"INIT failed: {getattr(error, 'message', None) or error}")
        attempt.enter(rollout_pb2.SESSION_STAGE_READY)
        async with self._run_slots:
            attempt.enter(rollout_pb2.SESSION_STAGE_RUN)
            try:
                await self._stages.run(attempt, max(0.0, min(agent_limit, session_limit - attempt.active_seconds())))
            except LodestarError as error:
                return infra(f"harness could not run: {error.message}")
            finally:
                attempt.enter(rollout_pb2.SESSION_STAGE_POST)
                self._wake.set()  # a run slot is free: ask for more work now
        async with self._post_pool:
            return await self._stages.post(attempt)

    async def _report(self, attempt: Attempt, outcome: Outcome) -> str:
        """Report the attempt's result to rollout; `complete_with_retries`'s status."""
        runtime = attempt.runtime
        details = {**(outcome.details or {})}
        if runtime is not None:
            details["runtime"] = {
                **runtime.details(),
                "network_isolated": bool(attempt.harness and attempt.harness.isolated),
            }
        result = attempt.result(
            self.node_id, outcome.outcome, reward=outcome.reward, error=outcome.error, details=details
        )
        name = rollout_pb2.SessionOutcome.Name(outcome.outcome)
        self.outcomes[name] = self.outcomes.get(name, 0) + 1
        policy = self.config.report
        if self._stopping:
            policy = RetryPolicy(attempts=2, initial_s=0.2, max_s=0.5, rpc_timeout_s=3.0)
        try:
            status = await complete_with_retries(self._rollout, result, policy)
        except Exception:  # never lose an attempt silently: log it (the lease requeues it if rollout lost it)
            _log.exception("reporting failed unexpectedly", session_id=result.session_id, attempt=result.attempt)
            status = "error"
        # An infrastructure failure is the node's to explain: the end of what the harness printed goes into the
        # log line (a harness that gave up says why there; the full tails travel in the result).
        said: dict[str, str] = {}
        if outcome.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED and attempt.harness is not None:
            said = {
                "stdout_tail": result.stdout_tail[-LOG_TAIL_CHARS:],
                "stderr_tail": result.stderr_tail[-LOG_TAIL_CHARS:],
            }
        _log.info(
            "session finished",
            session_id=result.session_id,
            attempt=result.attempt,
            outcome=name,
            reward=result.reward,
            calls=len(result.calls),
            error=result.error or None,
            report=status,
            seconds={k: round(v, 3) for k, v in attempt.seconds.items()},
            **said,
        )
        return status

    # Shutdown ------------------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Drain (the module docstring): take no new work, hand back what has not started, let the rest
        finish within `drain_grace_s`, hand back what is left, report (bounded), remove the workspaces."""
        self._stopping = True
        self._wake.set()
        for key, attempt in list(self._attempts.items()):
            if attempt.stage in _NOT_STARTED:
                self.cancel(key, DRAINING)
        started = list(self._tasks.values())
        if started and self.config.drain_grace_s > 0:
            _log.info("draining", attempts=len(started), grace_s=self.config.drain_grace_s)
            await asyncio.wait(started, timeout=self.config.drain_grace_s)
        self._polling = False  # a cancelled RPC may surface as an error the loop survives: the flag ends it
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        for key in list(self._attempts):
            self.cancel(key, f"{DRAINING}: not finished within the drain grace ({self.config.drain_grace_s:g} s)")
        tasks = list(self._tasks.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout_s)
        for task in pending:  # e.g. stuck reporting: give up on the report, keep the cleanup
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)


def _seconds(value: object) -> float:
    seconds = getattr(value, "seconds", 0)
    nanos = getattr(value, "nanos", 0)
    return float(seconds) + float(nanos) / 1e9
