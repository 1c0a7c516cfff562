"""lodestar/kinds.py: the one list of harness, verifier and runtime kinds, and what `pi:<api>` means."""

from __future__ import annotations

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.kinds import (
    DEFAULT_PI_API,
    PI_APIS,
    harness_kinds,
    pi_api,
    runtime_kind,
    validate_harness,
    validate_verifier_kind,
)
from lodestar.v1 import rollout_pb2


def test_pi_defaults_to_openai_chat_and_other_harnesses_have_no_api() -> None:
    assert pi_api(rollout_pb2.HarnessSpec(kind="pi")) == DEFAULT_PI_API == "openai-completions"
    assert pi_api(rollout_pb2.HarnessSpec(kind="codex", env={"LODESTAR_PI_API": "openai-responses"})) is None


@pytest.mark.parametrize("api", PI_APIS)
def test_pi_colon_api_means_pi_with_the_api_in_its_env(api: str) -> None:
    assert f"pi:{api}" in harness_kinds()
    assert pi_api(rollout_pb2.HarnessSpec(kind=f"pi:{api}")) == api
    assert pi_api(rollout_pb2.HarnessSpec(kind="pi", env={"LODESTAR_PI_API": api})) == api
    assert pi_api(rollout_pb2.HarnessSpec(kind=f"pi:{api}", env={"LODESTAR_PI_API": api})) == api


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (rollout_pb2.HarnessSpec(kind="pi:"), "unknown Pi API ''"),
        (rollout_pb2.HarnessSpec(kind="pi", env={"LODESTAR_PI_API": "bedrock"}), "unknown Pi API 'bedrock'"),
        (
            rollout_pb2.HarnessSpec(kind="pi:anthropic-messages", env={"LODESTAR_PI_API": "openai-responses"}),
            "name different Pi APIs",
        ),
        (
            rollout_pb2.HarnessSpec(kind="claude-code"),
            "unknown harness kind 'claude-code' \\(kinds are spelled with '_': 'claude_code'\\)",
        ),
        (rollout_pb2.HarnessSpec(kind="mini-swe-agent"), "spelled with '_': 'mini_swe_agent'"),
        (rollout_pb2.HarnessSpec(kind="codex:responses"), "unknown harness kind"),
        (rollout_pb2.HarnessSpec(), "unknown harness kind ''"),
        (rollout_pb2.HarnessSpec(kind="command"), "needs harness.command"),
    ],
)
def test_bad_harness_specs_are_refused(spec: rollout_pb2.HarnessSpec, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        validate_harness(spec)


def test_verifier_and_runtime_kinds() -> None:
    validate_verifier_kind("swe")
    with pytest.raises(InvalidArgumentError, match="unknown verifier kind 'bleu'"):
        validate_verifier_kind("bleu")
    assert runtime_kind(rollout_pb2.RuntimeSpec()) == "host"
    assert runtime_kind(rollout_pb2.RuntimeSpec(kind="docker")) == "docker"
    with pytest.raises(InvalidArgumentError, match="unknown runtime kind 'podman'"):
        runtime_kind(rollout_pb2.RuntimeSpec(kind="podman"))
