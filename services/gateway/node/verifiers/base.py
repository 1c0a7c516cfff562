"""What every verifier shares: its input (task, final answer, the session's workspace and a way to run a
process there), its verdict, and the error that marks a verifier failure as infrastructure, never a reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format, struct_pb2

from lodestar.errors import InvalidArgumentError, LodestarError
from lodestar.v1 import rollout_pb2
from services.gateway.node.harnesses import HarnessResult

DEFAULT_TIMEOUT_S = 300.0
TAIL_CHARS = 4000


class VerifierError(LodestarError):
    """The verifier crashed, timed out or could not run: an infrastructure failure (the attempt is
    reported INFRA_FAILED and retried), never a reward of 0."""


class SessionProcess(Protocol):
    """Runs a process in the session's runtime (its workspace as cwd, its fixed paths, a clean env)."""

    async def __call__(self, argv: list[str], env: Mapping[str, str], timeout_s: float) -> HarnessResult: ...


@dataclass(frozen=True)
class VerifierInput:
    task: rollout_pb2.Task
    final_answer: str
    """Text of the session's last assistant completion."""
    workspace: Path
    """The workspace as the session's processes see it."""
    timed_out: bool
    """The harness was killed at the agent timeout."""
    run: SessionProcess
    scratch: Path
    """A directory of the session (its TMPDIR) the node may write into, as the node sees it ..."""
    scratch_visible: Path
    """... and as the session's processes see it."""
    runtime_kind: str = "host"
    """The session's runtime (`RuntimeSpec.kind`: "host" or "docker")."""


@dataclass(frozen=True)
class Verdict:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


class Verifier(Protocol):
    kind: str

    async def score(self, given: VerifierInput) -> Verdict: ...


def config_dict(config: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(config)


def timeout_of(config: Mapping[str, Any], kind: str) -> float:
    raw = config.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise InvalidArgumentError(f"{kind} verifier: timeout_s must be a positive number, got {raw!r}")
    return float(raw)


def task_metadata(task: rollout_pb2.Task) -> dict[str, Any]:
    return json_format.MessageToDict(task.metadata)


def tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def process_failure(result: HarnessResult, kind: str, timeout_s: float) -> VerifierError | None:
    """The infrastructure failure a finished verifier process shows, if any: a timeout, death by a signal,
    or a command that could not be found or executed (126/127)."""
    if result.timed_out:
        return VerifierError(f"{kind} verifier timed out after {timeout_s:g} s")
    if result.returncode < 0:
        return VerifierError(f"{kind} verifier was killed by signal {-result.returncode}")
    if result.returncode in (126, 127):
        return VerifierError(
            f"{kind} verifier command could not run (exit {result.returncode}): {tail(result.stderr)[-500:]}"
        )
    return None
