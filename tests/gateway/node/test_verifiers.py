"""Verifiers: every kind on a real session runtime (real processes in the session's fixed paths); a crash,
a hang or a command that cannot run is a VerifierError (infrastructure), never a reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from services.gateway.node.harnesses import Launcher
from services.gateway.node.runtimes import HostBackend, HostRuntime
from services.gateway.node.verifiers import VERIFIERS, VerifierError, VerifierInput, make_verifier
from services.gateway.node.verifiers.exact_match import normalize

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


@pytest.mark.parametrize(
    ("command", "reward"),
    [
        ('test "$(cat out.txt)" = hi', 1.0),
        ('test "$(cat out.txt)" = bye', 0.0),
        ("echo checking; echo 0.25 > $LODESTAR_REWARD_FILE; exit 1", 0.25),
        ('test "$PWD" = /tmp/lodestar-session/work -a "$HOME" = /tmp/lodestar-session/home', 1.0),
        ('test "$LODESTAR_FINAL_ANSWER" = done -a "$LODESTAR_TASK_ID" = t1', 1.0),
    ],
)
async def test_command_verifier_rewards(runtime: HostRuntime, command: str, reward: float):
    got, details = await _score(runtime, "command", command=command)
    assert got == reward, details
    assert details["reward_from"] == ("file" if reward == 0.25 else "exit_code")


async def test_command_verifier_gets_an_answer_with_nul_characters_without_them(runtime: HostRuntime):
    # A tiny model's output decoded to a NUL in a quickstart run; an environment variable cannot hold one.
    got, details = await _score(runtime, "command", "do\0ne", command='test "$LODESTAR_FINAL_ANSWER" = done')
    assert got == 1.0, details


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"command": "sleep 30", "timeout_s": 0.5}, "timed out"),
        ({"command": "no-such-verifier-command"}, "could not run"),
        ({"command": "kill -9 $$"}, "signal 9"),
    ],
)
async def test_command_verifier_failures_are_errors_not_zero(runtime: HostRuntime, config, message):
    with pytest.raises(VerifierError, match=message):
        await _score(runtime, "command", **config)


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
        ("python", {"function": "no_colon"}),
        ("exact_match", {"field": ""}),
    ],
)
def test_bad_specs_are_invalid_arguments(kind: str, config: dict[str, Any]):
    with pytest.raises(InvalidArgumentError):
        make_verifier(_spec(kind, **config))


def test_registry_has_every_kind():
    assert set(VERIFIERS) == {"command", "exact_match", "python", "swe"}
