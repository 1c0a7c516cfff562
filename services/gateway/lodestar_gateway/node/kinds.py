"""`HarnessSpec` -> the node's launcher adapter. The kind names and their validation are the kernel's
(`lodestar/kinds.py`, shared with rollout); this module maps each harness kind to its adapter in `harnesses/`.
"""

from __future__ import annotations

from pathlib import Path

from lodestar.kinds import COMMAND, pi_api, validate_harness
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, Harness, make_harness

LAUNCHER_NAMES: dict[str, str] = {
    "claude_code": "claude-code",
    "codex": "codex",
    "qwen_code": "qwen-code",
    "gemini_cli": "gemini-cli",
    "pi": "pi",
    "opencode": "opencode",
    "continue_cli": "continue-cli",
    "cline": "cline",
    "mini_swe_agent": "mini-swe-agent",
    "aider": "aider",
    "open_interpreter": "open-interpreter",
    "openhands": "openhands",
}
"""Harness kind -> launcher name (`make_harness`); `command` and `pi:<api>` are handled on their own."""


def harness_for(
    spec: rollout_pb2.HarnessSpec, *, session_id: str, task_id: str, bin_dir: Path | None = None
) -> Harness:
    """The adapter that runs one session of `spec` (InvalidArgumentError for a spec rollout would refuse)."""
    validate_harness(spec)
    if spec.kind == COMMAND:
        return Command(list(spec.command), bin_dir=bin_dir, session_id=session_id, task_id=task_id)
    api = pi_api(spec)
    if api is not None:
        return make_harness(f"pi:{api}", bin_dir)
    return make_harness(LAUNCHER_NAMES[spec.kind], bin_dir)
