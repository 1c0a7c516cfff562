"""`HarnessSpec.kind` -> launcher adapter, and validation of a spec's harness and verifier kinds.

Kinds: `claude_code`, `codex`, `qwen_code`, `gemini_cli`, `pi` (OpenAI Chat) or `pi:<api>` with <api> one
of openai-completions, openai-responses, anthropic-messages, google-generative-ai, `opencode`,
`mini_swe_agent`, `openhands`, and `command` (the
program in `HarnessSpec.command`). `validate_harness` / `validate_verifier` raise InvalidArgumentError
naming the problem; rollout may call them on CreateRun so a bad spec is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from services.gateway.node.harnesses import Command, Harness, make_harness
from services.gateway.node.harnesses.pi import PI_APIS

HARNESS_KINDS: dict[str, str] = {
    "claude_code": "claude-code",
    "codex": "codex",
    "qwen_code": "qwen-code",
    "gemini_cli": "gemini-cli",
    "pi": "pi",
    "opencode": "opencode",
    "mini_swe_agent": "mini-swe-agent",
    "openhands": "openhands",
    **{f"pi:{api}": f"pi:{api}" for api in PI_APIS},
}
"""Spec kind -> launcher name (plus "command")."""


def validate_harness(spec: rollout_pb2.HarnessSpec) -> None:
    if spec.kind == "command":
        if not spec.command:
            raise InvalidArgumentError("harness kind 'command' needs a non-empty `command` (argv)")
        return
    if spec.kind not in HARNESS_KINDS:
        known = ", ".join([*HARNESS_KINDS, "command"])
        raise InvalidArgumentError(f"unknown harness kind {spec.kind!r}; one of {known}")


def validate_verifier(spec: rollout_pb2.VerifierSpec) -> None:
    from services.gateway.node.verifiers import make_verifier

    make_verifier(spec)


def harness_for(
    spec: rollout_pb2.HarnessSpec, *, session_id: str, task_id: str, bin_dir: Path | None = None
) -> Harness:
    """The adapter that runs one session of `spec`."""
    validate_harness(spec)
    if spec.kind == "command":
        return Command(list(spec.command), bin_dir=bin_dir, session_id=session_id, task_id=task_id)
    return make_harness(HARNESS_KINDS[spec.kind], bin_dir)
