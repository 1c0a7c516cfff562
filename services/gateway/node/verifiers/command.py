"""`command` verifier: a shell command run in the session's workspace after the agent.

Config: {"command": "...", "timeout_s": N (default 300), "reward_from": "file" (default) | "stdout",
"reward_range": [low, high] (default [0, 1])}. It runs as `bash -c COMMAND` with the session's fixed paths
(same HOME/TMPDIR/workspace as the harness), a clean environment plus LODESTAR_TASK_ID, LODESTAR_FINAL_ANSWER
(the final answer, at most 64 KB, without NUL characters: an environment variable cannot hold one, and a
model's output can), LODESTAR_TIMED_OUT ("1" when the agent was cut at its timeout), LODESTAR_TASK_METADATA
(JSON) and LODESTAR_REWARD_FILE.

Reward: what the command wrote to $LODESTAR_REWARD_FILE (a number, or a JSON object {"reward": x}): a file
in a directory the node makes for this run only, after the agent ended, so nothing the agent left behind can
have written it. Without that file: 1.0 for exit 0, else 0.0. With `"reward_from": "stdout"` a last stdout
line {"reward": x} is read instead, as before Dec 2026: any code the command runs (the agent's code under
test) can print that line, so do not use it for untrusted agents. A reward file that is not a number, a
non-finite reward, a timeout, death by a signal or exit 126/127 (the command could not run) is a
VerifierError (infrastructure), never 0; a reward outside `reward_range` is clamped into it.
"""

from __future__ import annotations

import json
from typing import Any

from lodestar.errors import InvalidArgumentError
from services.gateway.node.safe_files import read_regular_file
from services.gateway.node.verifiers.base import (
    Verdict,
    VerifierError,
    VerifierInput,
    process_failure,
    tail,
    task_metadata,
    timeout_of,
)

MAX_ANSWER_ENV = 64 * 1024
REWARD_FILE = "reward"
REWARD_SOURCES = ("file", "stdout")
MAX_REWARD_BYTES = 4096


class CommandVerifier:
    kind = "command"

    def __init__(self, config: dict[str, Any]) -> None:
        command = config.get("command")
        if not isinstance(command, str) or not command.strip():
            raise InvalidArgumentError('command verifier needs config {"command": "..."}')
        self.command = command
        self.timeout_s = timeout_of(config, self.kind)
        self.reward_from = config.get("reward_from", "file")
        if self.reward_from not in REWARD_SOURCES:
            raise InvalidArgumentError(f"command verifier: reward_from must be one of {', '.join(REWARD_SOURCES)}")

    async def score(self, given: VerifierInput) -> Verdict:
        env = {
            "LODESTAR_TASK_ID": given.task.task_id,
            "LODESTAR_FINAL_ANSWER": given.final_answer[:MAX_ANSWER_ENV].replace("\0", ""),
            "LODESTAR_TIMED_OUT": "1" if given.timed_out else "0",
            "LODESTAR_TASK_METADATA": json.dumps(task_metadata(given.task)),
        }
        private, private_visible = given.private_dir(".lodestar-verifier-")
        env["LODESTAR_REWARD_FILE"] = str(private_visible / REWARD_FILE)
        result = await given.run(["bash", "-c", self.command], env, self.timeout_s)
        failure = process_failure(result, self.kind, self.timeout_s)
        if failure is not None:
            raise failure
        details: dict[str, Any] = {
            "kind": self.kind,
            "exit_code": result.returncode,
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
            "duration_s": round(result.duration_s, 3),
        }
        if self.reward_from == "file":
            written = read_regular_file(private, REWARD_FILE, limit=MAX_REWARD_BYTES)
            if written is not None:
                return Verdict(file_reward(written), {**details, "reward_from": "file"})
        elif (reported := reported_reward(result.stdout)) is not None:
            return Verdict(reported, {**details, "reward_from": "stdout"})
        return Verdict(1.0 if result.returncode == 0 else 0.0, {**details, "reward_from": "exit_code"})


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
