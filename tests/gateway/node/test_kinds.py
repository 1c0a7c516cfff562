"""HarnessSpec -> launcher adapter: every kernel kind has its adapter, verifier and runtime on the node; Pi's
API, args/env, fixed-path translation."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.kinds import COMMAND, HARNESS_KINDS, PI_APIS, RUNTIME_KINDS, VERIFIER_KINDS, harness_kinds
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.attempt import Attempt
from lodestar_gateway.node.harnesses import BUILTIN, Launcher, Pi, make_harness
from lodestar_gateway.node.kinds import harness_for
from lodestar_gateway.node.runtimes import DockerBackend, HostBackend
from lodestar_gateway.node.stages import SessionStages
from lodestar_gateway.node.verifiers import VERIFIERS


def test_every_kernel_kind_has_its_adapter_verifier_and_runtime():
    assert set(BUILTIN) == set(HARNESS_KINDS) - {COMMAND}  # one name per harness: its kind
    for kind in harness_kinds():
        spec = rollout_pb2.HarnessSpec(kind=kind, command=["true"] if kind == COMMAND else [])
        assert harness_for(spec, session_id="s", task_id="t").name == kind.split(":")[0]
    assert set(VERIFIERS) == set(VERIFIER_KINDS)
    assert {HostBackend.kind, DockerBackend.kind} == set(RUNTIME_KINDS)


@pytest.mark.parametrize("api", PI_APIS)
def test_pi_api_from_the_kind_or_the_env(api: str):
    by_kind = harness_for(rollout_pb2.HarnessSpec(kind=f"pi:{api}"), session_id="s", task_id="t")
    by_env = harness_for(rollout_pb2.HarnessSpec(kind="pi", env={"LODESTAR_PI_API": api}), session_id="s", task_id="t")
    assert isinstance(by_kind, Pi)
    assert isinstance(by_env, Pi)
    assert by_kind.api == by_env.api == api


@pytest.mark.parametrize(
    "spec",
    [
        rollout_pb2.HarnessSpec(kind="goose"),
        rollout_pb2.HarnessSpec(kind="command"),
        rollout_pb2.HarnessSpec(),
        rollout_pb2.HarnessSpec(kind="pi:bedrock"),
        rollout_pb2.HarnessSpec(kind="pi", env={"LODESTAR_PI_API": "bedrock"}),
    ],
)
def test_specs_rollout_refuses_have_no_adapter(spec: rollout_pb2.HarnessSpec):
    with pytest.raises(InvalidArgumentError):
        harness_for(spec, session_id="s", task_id="t")


async def test_invocation_applies_pi_api_args_env_and_fixed_paths(tmp_path: Path):
    launcher = Launcher()
    runtimes = HostBackend(tmp_path / "sessions", launcher)
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


@pytest.mark.parametrize("spelled", ["claude-code", "qwen-code", "mini-swe-agent", "open-interpreter"])
def test_a_kind_spelled_with_a_dash_is_refused_with_its_spelling(spelled: str) -> None:
    right = spelled.replace("-", "_")
    with pytest.raises(InvalidArgumentError, match=f"kinds are spelled with '_': '{right}'"):
        make_harness(spelled)
    with pytest.raises(InvalidArgumentError, match=f"kinds are spelled with '_': '{right}'"):
        harness_for(rollout_pb2.HarnessSpec(kind=spelled), session_id="s", task_id="t")
