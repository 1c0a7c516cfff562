"""`command` verifier: shell commands run in the session's runtime after the agent, in two steps.

Config: {"command": "...", "score": "...", "timeout_s": N (default 300, each step), "reward_from": "file"
(default) | "stdout", "reward_range": [low, high] (default [0, 1])}; at least one of command and score.

- `command`, the untrusted step: `bash -c COMMAND` with the session's fixed paths (workspace as cwd, the
  session's HOME/TMPDIR) and a clean environment plus LODESTAR_TASK_ID, LODESTAR_FINAL_ANSWER (the final
  answer, at most 64 KB, without NUL characters: an environment variable cannot hold one, and a model's
  output can) and LODESTAR_TIMED_OUT ("1" when the agent was cut at its timeout). It may run the agent's
  code (tests, builds, the agent's program), so it gets nothing the agent must not have: neither the task
  metadata (expected answers, gold patches) nor a reward channel. A timeout, death by a signal or exit
  126/127 of this step is the agent's doing (`AgentFailure`: the lowest reward, with the reason).
- `score`, the trusted step: `bash -c SCORE` run after every process of the command step is gone (a new
  process of the runtime: a fresh sandbox on the host, a restarted container on docker), with the same
  variables plus LODESTAR_TASK_METADATA (JSON), LODESTAR_REWARD_FILE, LODESTAR_WORKSPACE, and the command
  step's LODESTAR_COMMAND_EXIT (its exit code; empty without a command step), LODESTAR_COMMAND_STDOUT and
  LODESTAR_COMMAND_STDERR (files holding its output). Its cwd is the workspace (to read the agent's files),
  but HOME and TMPDIR are new private directories and Python started there neither imports from the
  working directory nor reads a user site (PYTHONSAFEPATH, PYTHONNOUSERSITE). It must run nothing of the
  agent's: its failures (timeout, signal, 126/127, a reward file that is not a number) are VerifierErrors.

Reward: with a score step, what it wrote to $LODESTAR_REWARD_FILE (a number, or a JSON object {"reward":
x}; the file lies in a directory the node makes after the command step ended), else 1.0 for its exit 0 and
0.0 otherwise. Without one, the command step's exit: 1.0 for 0, else 0.0. `"reward_from": "stdout"` reads a
last stdout line {"reward": x} of the deciding step instead; of the command step, any code it runs can
print that line, so do not use it with untrusted agents. A reward outside `reward_range` is clamped into it.

Before Dec 2026 one `command` got the metadata and the reward file itself: any code it ran could read the
answer or write its own reward. Such a config (a command step naming LODESTAR_TASK_METADATA or
LODESTAR_REWARD_FILE, without a score step) is refused with the migration; docs/nodes.md explains it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar_gateway.node.harnesses import HarnessResult
from lodestar_gateway.node.safe_files import make_private_dir, read_regular_file, write_new_file
from lodestar_gateway.node.verifiers.base import (
    Verdict,
    VerifierError,
    VerifierInput,
    agent_process_failure,
    process_failure,
    tail,
    task_metadata,
    timeout_of,
)

MAX_ANSWER_ENV = 64 * 1024
REWARD_FILE = "reward"
REWARD_SOURCES = ("file", "stdout")
MAX_REWARD_BYTES = 4096
SECRETS = ("LODESTAR_TASK_METADATA", "LODESTAR_REWARD_FILE")
"""What only the score step gets."""
MIGRATION = (
    "command verifier: the command step runs the agent's code and no longer gets {names}; move the part "
    'that reads them to a "score" step (it runs after the command, gets them and $LODESTAR_COMMAND_EXIT / '
    '_STDOUT / _STDERR), or rename "command" to "score" if it runs nothing of the agent\'s (docs/nodes.md)'
)
SCORE_ENV = {
    "PYTHONSAFEPATH": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": "/dev/null",
}
"""Defence in depth for a score step started in the agent's workspace (docs/nodes.md says what is left)."""


class CommandVerifier:
    kind = "command"

    def __init__(self, config: dict[str, Any]) -> None:
        self.command = _step(config, "command")
        self.score_command = _step(config, "score")
        if self.command is None and self.score_command is None:
            raise InvalidArgumentError('command verifier needs config {"command": "..."} and/or {"score": "..."}')
        if self.command is not None and self.score_command is None:
            named = [name for name in SECRETS if name in self.command]
            if named:
                raise InvalidArgumentError(MIGRATION.format(names=" and ".join(named)))
        self.timeout_s = timeout_of(config, self.kind)
        self.reward_from = config.get("reward_from", "file")
        if self.reward_from not in REWARD_SOURCES:
            raise InvalidArgumentError(f"command verifier: reward_from must be one of {', '.join(REWARD_SOURCES)}")

    async def score(self, given: VerifierInput) -> Verdict:
        env = {
            "LODESTAR_TASK_ID": given.task.task_id,
            "LODESTAR_FINAL_ANSWER": given.final_answer[:MAX_ANSWER_ENV].replace("\0", ""),
            "LODESTAR_TIMED_OUT": "1" if given.timed_out else "0",
        }
        details: dict[str, Any] = {"kind": self.kind}
        ran: HarnessResult | None = None
        if self.command is not None:
            ran = await given.run(["bash", "-c", self.command], env, self.timeout_s)
            details.update(_described(ran))
            failure = agent_process_failure(ran, "the verifier's command step", self.timeout_s)
            if failure is not None:
                failure.details.update(details)
                raise failure
        if self.score_command is None:
            assert ran is not None
            return self._decided(ran, None, details)
        return await self._score_step(given, env, ran, details)

    async def _score_step(
        self, given: VerifierInput, env: dict[str, str], ran: HarnessResult | None, details: dict[str, Any]
    ) -> Verdict:
        """Run the trusted step (module docstring) in new private directories, after the command step."""
        assert self.score_command is not None
        private, visible = given.private_dir(".lodestar-score-")
        write_new_file(private, "command.stdout", (ran.stdout if ran else "").encode("utf-8"), mode=0o444)
        write_new_file(private, "command.stderr", (ran.stderr if ran else "").encode("utf-8"), mode=0o444)
        dirs = {name: make_private_dir(private, ".", name, owner=given.owner) for name in ("home-", "tmp-")}
        home, tmp = (str(visible / dirs[name].name) for name in ("home-", "tmp-"))
        score_env = {
            **env,
            **SCORE_ENV,
            "HOME": home,
            "TMPDIR": tmp,
            "TMP": tmp,
            "TEMP": tmp,
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "LODESTAR_TASK_METADATA": json.dumps(task_metadata(given.task)),
            "LODESTAR_REWARD_FILE": str(visible / REWARD_FILE),
            "LODESTAR_WORKSPACE": str(given.workspace),
            "LODESTAR_COMMAND_EXIT": str(ran.returncode) if ran else "",
            "LODESTAR_COMMAND_STDOUT": str(visible / "command.stdout"),
            "LODESTAR_COMMAND_STDERR": str(visible / "command.stderr"),
        }
        scored = await given.run(["bash", "-c", self.score_command], score_env, self.timeout_s)
        failure = process_failure(scored, f"{self.kind} (score step)", self.timeout_s)
        if failure is not None:
            raise failure
        details["score"] = _described(scored)
        return self._decided(scored, private, details)

    def _decided(self, result: HarnessResult, private: Path | None, details: dict[str, Any]) -> Verdict:
        """The reward of the deciding step (the score step when there is one): its reward file (score step
        only), its stdout line (reward_from: stdout), else its exit code."""
        step = "score" if private is not None else "command"
        if self.reward_from == "file" and private is not None:
            written = read_regular_file(private, REWARD_FILE, limit=MAX_REWARD_BYTES)
            if written is not None:
                return Verdict(file_reward(written), {**details, "reward_from": "file", "decided_by": step})
        elif self.reward_from == "stdout" and (reported := reported_reward(result.stdout)) is not None:
            return Verdict(reported, {**details, "reward_from": "stdout", "decided_by": step})
        reward = 1.0 if result.returncode == 0 else 0.0
        return Verdict(reward, {**details, "reward_from": "exit_code", "decided_by": step})


def _step(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"command verifier: {key} must be a non-empty shell command")
    return value


def _described(result: HarnessResult) -> dict[str, Any]:
    return {
        "exit_code": result.returncode,
        "stdout_tail": tail(result.stdout),
        "stderr_tail": tail(result.stderr),
        "duration_s": round(result.duration_s, 3),
    }


def file_reward(content: bytes) -> float:
    """The reward a command wrote to its reward file: a number or {"reward": x} (VerifierError otherwise;
    non-finite values are refused by the verdict check)."""
    try:
        parsed = json.loads(content.decode("utf-8", errors="replace").strip())
    except ValueError as error:
        raise VerifierError(f"command verifier: the reward file holds {content[:80]!r}, not a number") from error
    value = parsed.get("reward") if isinstance(parsed, dict) else parsed
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"command verifier: the reward file holds {content[:80]!r}, not a number")
    return float(value)


def reported_reward(stdout: str) -> float | None:
    """x from a last non-empty stdout line {"reward": x}, else None."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        parsed = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(parsed, dict) or "reward" not in parsed:
        return None
    value = parsed["reward"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
