"""HarnessSpec -> launcher adapter: kinds, validation, Pi's API, args/env, fixed-path translation."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from services.gateway.node.attempt import Attempt
from services.gateway.node.harnesses import Launcher
from services.gateway.node.kinds import HARNESS_KINDS, harness_for, validate_harness, validate_verifier
from services.gateway.node.runtime import RuntimeFactory
from services.gateway.node.stages import SessionStages


@pytest.mark.parametrize(
    ("kind", "name"),
    [("claude_code", "claude-code"), ("codex", "codex"), ("qwen_code", "qwen-code"), ("gemini_cli", "gemini-cli"),
     ("pi", "pi"), ("pi:google-generative-ai", "pi")],
)  # fmt: skip
def test_every_kind_has_its_adapter(kind: str, name: str):
    assert harness_for(rollout_pb2.HarnessSpec(kind=kind), session_id="s", task_id="t").name == name


@pytest.mark.parametrize(
    "spec",
    [rollout_pb2.HarnessSpec(kind="aider"), rollout_pb2.HarnessSpec(kind="command"), rollout_pb2.HarnessSpec()],
)
def test_bad_harness_specs_are_invalid_arguments(spec: rollout_pb2.HarnessSpec):
    with pytest.raises(InvalidArgumentError):
        validate_harness(spec)


def test_validate_verifier_checks_kind_and_config():
    validate_verifier(rollout_pb2.VerifierSpec(kind="exact_match"))
    with pytest.raises(InvalidArgumentError, match="unknown verifier kind"):
        validate_verifier(rollout_pb2.VerifierSpec(kind="bleu"))
    assert "command" not in HARNESS_KINDS  # command is validated on its own (needs an argv)


async def test_invocation_applies_pi_api_args_env_and_fixed_paths(tmp_path: Path):
    launcher = Launcher()
    runtimes = RuntimeFactory(tmp_path / "sessions", launcher)
    stages = SessionStages(
        sessions=None, store=None, proxy=None, launcher=launcher, runtimes=runtimes,  # type: ignore[arg-type]
        base_url="http://127.0.0.1:9", default_model="lodestar",
    )  # fmt: skip
    assignment = rollout_pb2.SessionAssignment(
        session_id="s1",
        attempt=1,
        task=rollout_pb2.Task(task_id="t1", prompt="do it"),
        harness=rollout_pb2.HarnessSpec(
            kind="pi", args=["--verbose"], env={"LODESTAR_PI_API": "anthropic-messages", "EXTRA": "1"}
        ),
    )
    attempt = Attempt(assignment)
    attempt.runtime = await runtimes.create(attempt.name, {})
    attempt.gateway_session_key = "lsk-key"

    invocation = stages.invocation(attempt)

    assert invocation.harness == "pi:anthropic-messages"
    assert invocation.argv[-1] == "--verbose"
    assert invocation.env["EXTRA"] == "1"
    assert invocation.env["HOME"] == "/tmp/lodestar-session/home"
    assert invocation.cwd == Path("/tmp/lodestar-session/work")
    assert "lodestar" in invocation.argv  # the default model
