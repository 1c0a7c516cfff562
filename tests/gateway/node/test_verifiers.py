"""Verifiers: every kind on a real session runtime (real processes in the session's fixed paths); a crash,
a hang or a command that cannot run is a VerifierError (infrastructure), never a reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.runtimes import HostBackend, HostRuntime
from lodestar_gateway.node.verifiers import VERIFIERS, VerifierError, VerifierInput, make_verifier
from lodestar_gateway.node.verifiers.exact_match import normalize

FUNCTIONS = "tests.gateway.node.verifier_functions"


@pytest.fixture
async def runtime(tmp_path: Path) -> HostRuntime:
    launcher = Launcher()
    made = await HostBackend(tmp_path / "sessions", launcher).create("s1-a1", {"out.txt": "hi\n"})
    return made


def _given(runtime: HostRuntime, answer: str = "done", metadata: dict[str, Any] | None = None) -> VerifierInput:
    task = rollout_pb2.Task(task_id="t1", prompt="p")
    task.metadata.update(metadata or {"expected": "hi"})
    return VerifierInput(
        task=task,
        final_answer=answer,
        workspace=runtime.visible.workdir,
        timed_out=False,
        run=runtime.run_process,
        scratch=runtime.real.tmpdir,
        scratch_visible=runtime.visible.tmpdir,
    )


def _spec(kind: str, **config: Any) -> rollout_pb2.VerifierSpec:
    spec = rollout_pb2.VerifierSpec(kind=kind)
    spec.config.update(config)
    return spec


async def _score(runtime: HostRuntime, kind: str, answer: str = "done", **config: Any) -> tuple[float, dict]:
    verdict = await make_verifier(_spec(kind, **config)).score(_given(runtime, answer))
    return verdict.reward, verdict.details


EXPECTED = """python3 -c 'import json, os; print(json.loads(os.environ["LODESTAR_TASK_METADATA"])["expected"])'"""
FIXED_PATHS = 'test "$PWD" = /tmp/lodestar-session/work -a "$HOME" = /tmp/lodestar-session/home'
SEES_COMMAND = 'test "$LODESTAR_COMMAND_EXIT" = 3 && grep -qx hi "$LODESTAR_COMMAND_STDOUT"'
OWN_DIRS = (
    'test "$PWD" = "$LODESTAR_WORKSPACE" -a "$LODESTAR_COMMAND_EXIT" = "" -a "$HOME" != /tmp/lodestar-session/home'
)


@pytest.mark.parametrize(
    ("config", "reward", "reward_from"),
    [
        ({"command": 'test "$(cat out.txt)" = hi'}, 1.0, "exit_code"),
        ({"command": 'test "$(cat out.txt)" = bye'}, 0.0, "exit_code"),
        ({"command": FIXED_PATHS}, 1.0, "exit_code"),
        ({"command": 'test "$LODESTAR_FINAL_ANSWER" = done -a "$LODESTAR_TASK_ID" = t1'}, 1.0, "exit_code"),
        ({"command": "echo checking; exit 1", "score": "echo 0.25 > $LODESTAR_REWARD_FILE; exit 1"}, 0.25, "file"),
        ({"score": f'test "$(cat out.txt)" = "$({EXPECTED})"'}, 1.0, "exit_code"),
        ({"command": "cat out.txt; exit 3", "score": SEES_COMMAND}, 1.0, "exit_code"),
        ({"score": OWN_DIRS}, 1.0, "exit_code"),
    ],
)  # fmt: skip
async def test_command_verifier_rewards(runtime: HostRuntime, config: dict[str, Any], reward: float, reward_from: str):
    got, details = await _score(runtime, "command", **config)
    assert (got, details["reward_from"]) == (reward, reward_from), details


async def test_command_verifier_gets_an_answer_with_nul_characters_without_them(runtime: HostRuntime):
    # A tiny model's output decoded to a NUL in a quickstart run; an environment variable cannot hold one.
    got, details = await _score(runtime, "command", "do\0ne", command='test "$LODESTAR_FINAL_ANSWER" = done')
    assert got == 1.0, details


async def test_the_command_step_gets_no_metadata_and_no_reward_file(runtime: HostRuntime):
    config = {"command": "env > env.txt", "score": "true"}
    assert (await _score(runtime, "command", **config))[0] == 1.0
    seen = (runtime.real.workdir / "env.txt").read_text()
    assert "LODESTAR_TASK_ID=t1" in seen
    assert "LODESTAR_TASK_METADATA" not in seen
    assert "LODESTAR_REWARD_FILE" not in seen


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"command": "sleep 30", "timeout_s": 0.5}, "did not finish in 0.5 s"),
        ({"command": "no-such-program-of-the-agent"}, "exited 127"),
        ({"command": "kill -9 $$", "score": "echo 1 > $LODESTAR_REWARD_FILE"}, "killed by signal 9"),
    ],
)
async def test_a_command_step_that_fails_scores_the_lowest_reward_with_its_reason(runtime: HostRuntime, config, reason):
    got, details = await _score(runtime, "command", **config)
    assert got == 0.0
    assert reason in details["agent_failure"], details
    got, details = await _score(runtime, "command", **config, reward_range=[-1, 1])
    assert got == -1.0, "never better than a failed test"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"score": "sleep 30", "timeout_s": 0.5}, "timed out"),
        ({"command": "true", "score": "no-such-verifier-command"}, "could not run"),
        ({"score": "kill -9 $$"}, "signal 9"),
        ({"score": "echo high > $LODESTAR_REWARD_FILE"}, "not a number"),
    ],
)
async def test_score_step_failures_are_errors_not_zero(runtime: HostRuntime, config, message):
    with pytest.raises(VerifierError, match=message):
        await _score(runtime, "command", **config)


@pytest.mark.parametrize(
    "command",
    ["echo 1 > $LODESTAR_REWARD_FILE", "python3 -c \"import os; print(os.environ['LODESTAR_TASK_METADATA'])\""],
)
def test_an_old_command_that_needs_the_secrets_is_refused_with_the_migration(command: str):
    with pytest.raises(InvalidArgumentError, match='"score" step'):
        make_verifier(_spec("command", command=command))
    make_verifier(_spec("command", score=command))
    make_verifier(_spec("command", command="pytest -q", score=command))


@pytest.mark.parametrize(
    ("answer", "expected", "reward"),
    [
        ("  The  Answer is 42. ", "the answer is 42", 1.0),
        ("`42`", 42, 1.0),
        ("41", [40, "41"], 1.0),
        ("42", "43", 0.0),
        ("\uff26\uff55\uff4c\uff4cwidth", "fullwidth", 1.0),
    ],
)
async def test_exact_match_normalizes_both_sides(runtime: HostRuntime, answer: str, expected: Any, reward: float):
    verdict = await make_verifier(_spec("exact_match")).score(_given(runtime, answer, {"answer": expected}))
    assert verdict.reward == reward, verdict.details


async def test_exact_match_without_an_answer_is_an_error(runtime: HostRuntime):
    with pytest.raises(VerifierError, match=r"no metadata\.answer"):
        await make_verifier(_spec("exact_match")).score(_given(runtime, "x", {"other": 1}))


def test_normalize():
    assert normalize('"Done."') == "done"
    assert normalize("A\n\tB") == "a b"
    assert normalize("Keep", case_sensitive=True) == "Keep"


async def test_python_verifier_sees_workspace_task_and_answer(runtime: HostRuntime):
    assert (await _score(runtime, "python", function=f"{FUNCTIONS}:file_matches_answer"))[0] == 1.0
    assert (await _score(runtime, "python", "nope", function=f"{FUNCTIONS}:file_matches_answer"))[0] == 0.5


@pytest.mark.parametrize(
    ("function", "config", "message"),
    [
        ("crash", {}, "ZeroDivisionError"),
        ("hang", {"timeout_s": 1}, "timed out"),
        ("not_a_number", {}, "not a finite number"),
        ("missing", {}, "AttributeError"),
    ],
)
async def test_python_verifier_failures_are_errors_not_zero(runtime: HostRuntime, function, config, message):
    with pytest.raises(VerifierError, match=message):
        await _score(runtime, "python", function=f"{FUNCTIONS}:{function}", **config)


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("bleu", {}),
        ("command", {}),
        ("command", {"command": "true", "timeout_s": -1}),
        ("command", {"score": " "}),
        ("command", {"command": "true", "score": 1}),
        ("python", {"function": "no_colon"}),
        ("exact_match", {"field": ""}),
    ],
)
def test_bad_specs_are_invalid_arguments(kind: str, config: dict[str, Any]):
    with pytest.raises(InvalidArgumentError):
        make_verifier(_spec(kind, **config))


def test_registry_has_every_kind():
    assert set(VERIFIERS) == {"command", "exact_match", "python", "swe"}
