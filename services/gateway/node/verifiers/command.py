"""`command` verifier: a shell command run in the session's workspace after the agent.

Config: {"command": "...", "timeout_s": N (default 300)}. It runs as `bash -c COMMAND` with the session's
fixed paths (same HOME/TMPDIR/workspace as the harness), a clean environment plus LODESTAR_TASK_ID,
LODESTAR_FINAL_ANSWER (the final answer, at most 64 KB, without NUL characters: an environment variable cannot
hold one, and a model's output can), LODESTAR_TIMED_OUT ("1" when the agent was cut
at its timeout) and LODESTAR_TASK_METADATA (JSON). Reward: 1.0 for exit 0, else 0.0, unless the last
non-empty stdout line is a JSON object {"reward": x} (then x). A timeout, death by a signal or exit
126/127 (the command could not run) is a VerifierError (infrastructure), not 0.
"""

from __future__ import annotations

import json
from typing import Any

from lodestar.errors import InvalidArgumentError
from services.gateway.node.verifiers.base import (
    Verdict,
    VerifierInput,
    process_failure,
    tail,
    task_metadata,
    timeout_of,
)

MAX_ANSWER_ENV = 64 * 1024


class CommandVerifier:
    kind = "command"

    def __init__(self, config: dict[str, Any]) -> None:
        command = config.get("command")
        if not isinstance(command, str) or not command.strip():
            raise InvalidArgumentError('command verifier needs config {"command": "..."}')
        self.command = command
        self.timeout_s = timeout_of(config, self.kind)

    async def score(self, given: VerifierInput) -> Verdict:
        env = {
            "LODESTAR_TASK_ID": given.task.task_id,
            "LODESTAR_FINAL_ANSWER": given.final_answer[:MAX_ANSWER_ENV].replace("\0", ""),
            "LODESTAR_TIMED_OUT": "1" if given.timed_out else "0",
            "LODESTAR_TASK_METADATA": json.dumps(task_metadata(given.task)),
        }
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
        reported = reported_reward(result.stdout)
        if reported is not None:
            return Verdict(reported, {**details, "reward_from": "stdout"})
        return Verdict(1.0 if result.returncode == 0 else 0.0, {**details, "reward_from": "exit_code"})


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
