"""What every verifier shares: its input (task, final answer, the session's workspace and a way to run a
process there), its verdict, the two ways a verifier can fail — `VerifierError` (infrastructure: retried,
never a reward) and `AgentFailure` (the agent caused it: scored with the lowest reward of the range, its
reason in the details) — and the declared reward range every verdict is checked against (`checked_verdict`:
a non-finite reward is a verifier failure, one outside `reward_range` is clamped into it, and the details
say so). docs/nodes.md, "Who failed", lists which failure is which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format, struct_pb2

from lodestar.errors import InvalidArgumentError, LodestarError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import HarnessResult
from lodestar_gateway.node.safe_files import give_tree, make_private_dir

DEFAULT_TIMEOUT_S = 300.0
TAIL_CHARS = 4000
DEFAULT_REWARD_RANGE = (0.0, 1.0)


class VerifierError(LodestarError):
    """The verifier crashed, timed out or could not run: an infrastructure failure (the attempt is
    reported INFRA_FAILED and retried), never a reward of 0."""


class AgentFailure(LodestarError):
    """The agent caused the verifier to fail (the code under test hangs, crashes or ends the verifier's
    process; the agent broke what the verifier needs): the attempt is scored, with the lowest reward of the
    verifier's range and this reason (`details.agent_failure`), and never retried. Raise it only where the
    failure can be told apart from the node's, the runtime's or the dataset's (those are VerifierError)."""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


def agent_failure_verdict(failure: AgentFailure, bounds: tuple[float, float], kind: str) -> Verdict:
    """The verdict of an agent-caused verifier failure: the lowest reward of `bounds` (an agent must never
    gain by breaking its verifier rather than failing its tests), with the reason."""
    return Verdict(bounds[0], {"kind": kind, **failure.details, "agent_failure": failure.message})


class SessionProcess(Protocol):
    """Runs a process in the session's runtime (its workspace as cwd, its fixed paths, a clean env)."""

    async def __call__(
        self, argv: list[str], env: Mapping[str, str], timeout_s: float, *, binds: Sequence[tuple[Path, Path]] = ()
    ) -> HarnessResult:
        """`binds` (node directory, where the process sees it): more directories bound read-write into this run
        (the `swe` verifier's scoring directory); a runtime that cannot bind raises FailedPreconditionError."""
        ...


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
    root: Path | None = None
    """The session's private root on the node (made by the node; the session can change what is below it,
    never the root itself): node writes below it go through lodestar_gateway/node/safe_files.py. None: the
    scratch directory itself is the root (tests that build an input by hand)."""
    workspace_host: Path | None = None
    """The workspace as the node sees it (None: not known; the swe verifier then scores in place)."""
    owner: tuple[int, int] | None = None
    """The (uid, gid) the session's processes (the verifier's included) run as when not the node's own
    (`SessionRuntime.owner`): private directories and trees the node builds for them are given to it."""

    def private_dir(self, prefix: str) -> tuple[Path, Path]:
        """A new directory in the scratch directory that no session process has seen (random name, 0700,
        made without following links, owned by the session's user): (as the node sees it, as the session's
        processes see it)."""
        root = self.root or self.scratch
        relative = self.scratch.relative_to(root).as_posix() if self.scratch != root else "."
        host = make_private_dir(root, relative, prefix, owner=self.owner)
        return host, self.scratch_visible / host.name

    def hand_over(self, tree: Path) -> None:
        """Give a tree the node built in a private directory to the session's user (its tests may write
        there); nothing to do when that is the node's own uid."""
        if self.owner is not None:
            give_tree(tree, self.owner)


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


def reward_range(config: Mapping[str, Any], kind: str) -> tuple[float, float]:
    """The declared (low, high) of a verifier's rewards: config `reward_range` [low, high], default [0, 1]."""
    raw = config.get("reward_range", list(DEFAULT_REWARD_RANGE))
    valid = (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(value, int | float) and not isinstance(value, bool) for value in raw)
        and all(math.isfinite(value) for value in raw)
        and raw[0] < raw[1]
    )
    if not valid:
        raise InvalidArgumentError(f"{kind} verifier: reward_range must be [low, high] with low < high, got {raw!r}")
    return float(raw[0]), float(raw[1])


def checked_verdict(verdict: Verdict, bounds: tuple[float, float], kind: str) -> Verdict:
    """`verdict` with its reward in `bounds` (clamped, `details.reward_clamped_from` set); VerifierError for a
    reward that is not a finite number (NaN would poison the whole group's advantages)."""
    reward = verdict.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise VerifierError(f"{kind} verifier gave a reward that is not a finite number: {reward!r}")
    low, high = bounds
    if low <= reward <= high:
        return verdict
    return Verdict(min(max(float(reward), low), high), {**verdict.details, "reward_clamped_from": reward})


def task_metadata(task: rollout_pb2.Task) -> dict[str, Any]:
    return json_format.MessageToDict(task.metadata)


def tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def killed_by(result: HarnessResult) -> int | None:
    """The signal that ended a process: a negative exit status, or 128 + N, which the sandbox's pid 1,
    `docker exec` and a shell whose last command died by signal N report (a verifier exiting 129..192 on
    purpose is taken for a signal too)."""
    if result.returncode < 0:
        return -result.returncode
    if 128 < result.returncode <= 128 + 64:
        return result.returncode - 128
    return None


def process_failure(result: HarnessResult, kind: str, timeout_s: float) -> VerifierError | None:
    """The infrastructure failure a finished verifier process that runs nothing of the agent's shows, if
    any: a timeout, death by a signal, or a command that could not be found or executed (126/127)."""
    if result.timed_out:
        return VerifierError(f"{kind} verifier timed out after {timeout_s:g} s")
    if (signal := killed_by(result)) is not None:
        return VerifierError(f"{kind} verifier was killed by signal {signal}")
    if result.returncode in (126, 127):
        return VerifierError(
            f"{kind} verifier command could not run (exit {result.returncode}): {tail(result.stderr)[-500:]}"
        )
    return None


def agent_process_failure(result: HarnessResult, step: str, timeout_s: float) -> AgentFailure | None:
    """The failure a finished process that runs the agent's code shows, if any: a timeout, death by a signal
    or exit 126/127 (the agent can delete or break what it runs) are the agent's doing, never the node's."""
    if result.timed_out:
        return AgentFailure(f"{step} did not finish in {timeout_s:g} s (the code under test hangs)")
    if (signal := killed_by(result)) is not None:
        return AgentFailure(f"{step} was killed by signal {signal} (the code under test crashed)")
    if result.returncode in (126, 127):
        return AgentFailure(f"{step} exited {result.returncode} (a program it runs is missing or not executable)")
    return None
