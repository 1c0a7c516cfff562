"""What each lifecycle stage does to one attempt: INIT (runtime + gateway session), RUN (the harness),
POST (collect the captured calls, decide the outcome, run the verifier), and the release of everything the
attempt held. The lifecycle (`lifecycle.py`) decides when each runs, under which pool and deadline.

Outcome rules ("silent failures are failures"; docs/nodes.md, "Who failed"): a session with no captured
call, or whose last model calls failed (inference down) with no answer after them, is INFRA_FAILED with the
reason, whatever the harness's exit code; a harness that could not start, a runtime that could not be
prepared and a verifier that crashed or timed out on its own are INFRA_FAILED too. What the agent caused is
scored, with the lowest reward of the verifier's range and the reason: a last model call that inference
refused (its prompt overflowed the context; `Unanswered.refused`) and a verifier failure its code caused
(`AgentFailure`). Otherwise the verifier's reward stands, with outcome TIMED_OUT when the harness was killed
at its time limit and SCORED when it finished.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lodestar.errors import LodestarError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.node.attempt import Attempt, OutcomeCode, final_answer
from lodestar_gateway.node.harnesses import GatewayEndpoint, Invocation, Launcher
from lodestar_gateway.node.kinds import harness_for
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import Runtimes, SessionRuntime
from lodestar_gateway.node.verifiers import VerifierError, VerifierInput, make_verifier
from lodestar_gateway.node.verifiers.base import config_dict, reward_range
from lodestar_gateway.proxy import Proxy, Unanswered
from lodestar_gateway.sessions import SessionRegistry

_log = get_logger("gateway.node.stages")


@dataclass(frozen=True)
class Outcome:
    outcome: OutcomeCode
    reward: float = 0.0
    error: str = ""
    details: dict[str, Any] | None = None


def infra(error: str, **details: Any) -> Outcome:
    return Outcome(rollout_pb2.SESSION_OUTCOME_INFRA_FAILED, error=error, details=details or None)


ATTEMPT_LABEL = "rollout_session_id"
"""The label of every gateway session a node's lifecycle opens (the rollout session it samples)."""


class SessionStages:
    """The stage implementations of one node (shared by all its attempts)."""

    def __init__(
        self,
        *,
        sessions: SessionRegistry,
        store: CaptureStore,
        proxy: Proxy,
        launcher: Launcher,
        runtimes: Runtimes,
        base_url: str,
        default_model: str,
        bin_dir: Path | None = None,
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._proxy = proxy
        self._launcher = launcher
        self._runtimes = runtimes
        self._base_url = base_url
        self._model = default_model
        self._bin_dir = bin_dir

    async def init(self, attempt: Attempt) -> None:
        """Fresh runtime with the task's files (and repository), and a gateway session labelled with run and task
        that enforces the run's sampling policy."""
        assignment = attempt.assignment
        attempt.runtime = await self._runtimes.create(attempt.name, assignment)
        if assignment.task.HasField("repository"):  # a repository task: its repo at base_commit (docs/swe.md)
            await prepare_repository(assignment.task.repository, attempt.runtime.real.workdir)
        entry = await self._sessions.open(
            run_id=assignment.run_id,
            labels={
                ATTEMPT_LABEL: assignment.session_id,
                "attempt": str(assignment.attempt),
                "task_id": assignment.task.task_id,
                "group_id": assignment.group_id,
                "harness": assignment.harness.kind,
            },
            sampling_policy=assignment.sampling,  # the run's; unset means the default policy, still enforced
        )
        attempt.gateway_session_id = entry.session_id
        attempt.gateway_session_key = entry.session.session_key

    def invocation(self, attempt: Attempt) -> Invocation:
        """The harness run of `attempt`, as its processes will see it (fixed paths)."""
        assignment, runtime = attempt.assignment, _runtime(attempt)
        spec = assignment.harness
        harness = harness_for(
            spec, session_id=assignment.session_id, task_id=assignment.task.task_id, bin_dir=self._bin_dir
        )
        endpoint = GatewayEndpoint(self._base_url, attempt.gateway_session_key, spec.model or self._model)
        prepared = harness.prepare(runtime.real, endpoint, assignment.task.prompt)
        prepared = replace(prepared, argv=[*prepared.argv, *spec.args], env={**prepared.env, **spec.env})
        return runtime.translate(prepared)

    async def run(self, attempt: Attempt, timeout_s: float) -> None:
        """Run the harness to completion or `timeout_s` (its process group is killed on every exit path)."""
        attempt.harness = await _runtime(attempt).run_harness(self.invocation(attempt), self._base_url, timeout_s)

    async def collect(self, attempt: Attempt) -> Unanswered:
        """Close the gateway session (later calls with its key are refused) and read its captured calls into
        the attempt; returns the model calls that failed since the last answered one."""
        if not attempt.gateway_session_id:
            return Unanswered()
        with contextlib.suppress(LodestarError):
            await self._sessions.close(attempt.gateway_session_id)
        self._proxy.chains.drop(attempt.gateway_session_id)
        attempt.calls = await self._store.calls(attempt.gateway_session_id)
        return self._proxy.take_unanswered(attempt.gateway_session_id)

    async def post(self, attempt: Attempt) -> Outcome:
        """Collect the calls, apply the silent-failure rules, then score with the verifier."""
        failed, last_error, refused, abandoned = await self.collect(attempt)
        harness = attempt.harness
        assert harness is not None, "POST runs after RUN"
        runtime = _runtime(attempt)
        if not attempt.calls:
            if abandoned and not failed:
                return _agent_scored(attempt, f"the harness stopped reading all {abandoned} answer(s) streamed to it")
            why = f"; {failed} model call(s) failed, last: {last_error}" if failed else ""
            limit = " (killed at its time limit)" if harness.timed_out else ""
            return infra(f"harness exited {harness.returncode}{limit} without any answered model call{why}")
        if failed and refused:
            return _agent_scored(attempt, f"inference refused the agent's last model call: {last_error}")
        if failed:
            return infra(f"the harness's last {failed} model call(s) got no answer (inference failed: {last_error})")
        if runtime.limit_failure:
            return infra(runtime.limit_failure)
        try:
            verifier = make_verifier(attempt.assignment.verifier)
            verdict = await verifier.score(
                VerifierInput(
                    task=attempt.assignment.task,
                    final_answer=final_answer(attempt.calls),
                    workspace=runtime.visible.workdir,
                    timed_out=harness.timed_out,
                    run=runtime.run_process,
                    scratch=runtime.real.tmpdir,
                    scratch_visible=runtime.visible.tmpdir,
                    runtime_kind=runtime.kind,
                    root=runtime.root,
                    workspace_host=runtime.real.workdir,
                    owner=runtime.owner,
                )
            )
        except VerifierError as error:
            return infra(f"verifier failed: {error.message}")
        except LodestarError as error:
            return infra(f"verifier could not run: {error.message}")
        outcome = rollout_pb2.SESSION_OUTCOME_TIMED_OUT if harness.timed_out else rollout_pb2.SESSION_OUTCOME_SCORED
        why = f"agent killed after {harness.duration_s:.1f} s (time limit)" if harness.timed_out else ""
        if "agent_failure" in verdict.details:
            why = "; ".join(filter(None, [why, f"agent-caused verifier failure: {verdict.details['agent_failure']}"]))
        return Outcome(outcome, verdict.reward, why, verdict.details)

    async def release(self, attempt: Attempt) -> None:
        """Close the gateway session if still open and remove the runtime (idempotent)."""
        if attempt.gateway_session_id:
            with contextlib.suppress(LodestarError):
                await self._sessions.close(attempt.gateway_session_id)
            self._proxy.chains.drop(attempt.gateway_session_id)
            self._proxy.unanswered.pop(attempt.gateway_session_id, None)
        if attempt.runtime is not None:
            await attempt.runtime.cleanup()


def _agent_scored(attempt: Attempt, reason: str) -> Outcome:
    """An attempt the agent ended before its verifier could score it: the lowest reward of the verifier's
    range, with the reason (INFRA_FAILED if the verifier's config is bad)."""
    spec = attempt.assignment.verifier
    try:
        low, _ = reward_range(config_dict(spec.config), spec.kind)
    except LodestarError as error:
        return infra(f"verifier could not run: {error.message}")
    harness = attempt.harness
    timed_out = harness is not None and harness.timed_out
    outcome = rollout_pb2.SESSION_OUTCOME_TIMED_OUT if timed_out else rollout_pb2.SESSION_OUTCOME_SCORED
    return Outcome(outcome, low, reason, {"kind": spec.kind, "agent_failure": reason})


def _runtime(attempt: Attempt) -> SessionRuntime:
    if attempt.runtime is None:
        raise RuntimeError("the attempt has no runtime (INIT did not run)")
    return attempt.runtime
