"""An agent that tries to fool its verifier, or to make the node write or run something for it, on a real
host runtime with real git, pytest and bash. Each attack is first shown to work where the defence is off
(the `swe` verifier scoring in place, as it must for an in-image repository, or the command verifier
reading stdout), so the defence is what makes the difference."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import HostBackend, HostRuntime
from lodestar_gateway.node.safe_files import SessionFileError
from lodestar_gateway.node.verifiers import VerifierError, VerifierInput, make_verifier
from tests.gateway.node.swe_helpers import swe_mini_tasks, swe_score, swe_session

FAKE_PYTEST = """import sys
for arg in sys.argv[1:]:
    if "::" in arg:
        print("PASSED " + arg)
"""
FORCE_PASS_CONFTEST = """import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


@pytest.fixture
def slugify() -> rollout_pb2.Task:
    return swe_mini_tasks()["swe-mini-slugify"]


@pytest.mark.parametrize(
    "plant",
    [
        {"pytest.py": FAKE_PYTEST},
        {"conftest.py": FORCE_PASS_CONFTEST},
        {"pytest.ini": "[pytest]\naddopts = -p hackplugin\n", "hackplugin.py": FORCE_PASS_CONFTEST},
        {"tests/conftest.py": FORCE_PASS_CONFTEST},
    ],
    ids=["pytest.py", "conftest.py", "addopts", "tests-conftest.py"],
)
@pytest.mark.slow
async def test_planted_test_infrastructure_scores_what_the_code_deserves(
    tmp_path: Path, slugify: rollout_pb2.Task, plant: dict[str, str]
):
    runtime = await swe_session(tmp_path, slugify)
    for name, text in plant.items():
        (runtime.real.workdir / name).write_text(text)

    fooled, _ = await swe_score(runtime, slugify, pristine=False)
    honest, details = await swe_score(runtime, slugify)

    # The control: a conftest.py works on a tree the agent controls (in place); a planted pytest.py or
    # config file no longer does there either (the node's bootstrap, its own pytest config: docs/swe.md).
    assert fooled == (1.0 if "conftest.py" in "".join(plant) else 0.0)
    assert honest == 0.0, details
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}
    assert set(plant) - {"hackplugin.py"} <= set(details["ignored_files"])


@pytest.mark.slow
async def test_the_agents_git_config_and_hooks_never_run(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    runtime = await swe_session(tmp_path, slugify)
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    hooks = runtime.real.workdir / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("post-checkout", "pre-commit", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / hook).chmod(0o755)
    with (runtime.real.workdir / ".git" / "config").open("a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {marker}"\n\thooksPath = {hooks}\n')
    _agent_fixes(runtime, slugify)

    reward, details = await swe_score(runtime, slugify)

    assert reward == 1.0, details
    assert not marker.exists(), "a hook or fsmonitor of the agent's repository ran"


async def test_the_nodes_git_ignores_a_planted_global_config(tmp_path: Path, slugify: rollout_pb2.Task, monkeypatch):
    """A `~/.gitconfig` with core.hooksPath (an agent on a host node could write the node's HOME) runs nothing
    when the node checks a repository out."""
    home = tmp_path / "home"
    (home / "hooks").mkdir(parents=True)
    marker = tmp_path / "pwned"
    (home / "hooks" / "post-checkout").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (home / "hooks" / "post-checkout").chmod(0o755)
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {home / 'hooks'}\n")
    monkeypatch.setenv("HOME", str(home))
    argv = ["git", "config", "--global", "core.hooksPath"]
    probe = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
    assert probe.stdout.strip() == str(home / "hooks"), "the planted config is what a plain git would use"

    await prepare_repository(slugify.repository, tmp_path / "work")

    assert (tmp_path / "work" / "slugify").is_dir()
    assert not marker.exists()


def _agent_fixes(runtime: HostRuntime, task: rollout_pb2.Task) -> None:
    subprocess.run(["git", "apply"], input=task.metadata["gold_patch"], text=True, cwd=runtime.real.workdir, check=True)


async def test_a_test_patch_naming_paths_outside_the_repository_is_refused(tmp_path: Path, slugify: rollout_pb2.Task):
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    task.repository.test_patch = "--- a/../../victim\n+++ b/../../victim\n@@ -1 +1 @@\n-a\n+b\n"
    runtime = await swe_session(tmp_path, task)
    with pytest.raises(VerifierError, match="outside the repository"):
        await swe_score(runtime, task)


# -- the command and python verifiers --------------------------------------------------------------------


@pytest.fixture
async def runtime(tmp_path: Path) -> HostRuntime:
    return await HostBackend(tmp_path / "sessions", Launcher()).create("s1-a1", {})


def _given(runtime: HostRuntime) -> VerifierInput:
    return VerifierInput(
        task=rollout_pb2.Task(task_id="t1", prompt="p"),
        final_answer="done",
        workspace=runtime.visible.workdir,
        timed_out=False,
        run=runtime.run_process,
        scratch=runtime.real.tmpdir,
        scratch_visible=runtime.visible.tmpdir,
        root=runtime.root,
        workspace_host=runtime.real.workdir,
    )


async def _command(runtime: HostRuntime, command: str, **config: Any) -> tuple[float, dict[str, Any]]:
    spec = rollout_pb2.VerifierSpec(kind="command")
    spec.config.update({"command": command, **config})
    verdict = await make_verifier(spec).score(_given(runtime))
    return verdict.reward, verdict.details


async def test_a_reward_line_printed_by_the_agents_code_is_not_a_reward(runtime: HostRuntime) -> None:
    # The verifier runs the agent's script (as a test suite runs the agent's code); the script prints the line.
    (runtime.real.workdir / "check.sh").write_text("echo '{\"reward\": 1.0}'\nexit 1\n")

    fooled, _ = await _command(runtime, "bash check.sh", reward_from="stdout")
    honest, details = await _command(runtime, "bash check.sh")

    assert fooled == 1.0, "the control: a stdout-reading verifier is fooled"
    assert (honest, details["reward_from"]) == (0.0, "exit_code")


async def test_the_reward_file_is_new_for_every_verification(runtime: HostRuntime) -> None:
    reward, details = await _command(
        runtime, "true", score='test ! -e "$LODESTAR_REWARD_FILE" && echo 0.75 > "$LODESTAR_REWARD_FILE"'
    )
    assert (reward, details["reward_from"]) == (0.75, "file")


@pytest.mark.parametrize("written", ["NaN", "Infinity", '{"reward": -Infinity}', '{"reward": NaN}'])
async def test_a_non_finite_reward_is_an_infrastructure_failure(runtime: HostRuntime, written: str) -> None:
    with pytest.raises(VerifierError, match="not a finite number"):
        await _command(runtime, "true", score=f"echo '{written}' > $LODESTAR_REWARD_FILE")


async def test_a_non_finite_stdout_reward_is_an_infrastructure_failure(runtime: HostRuntime) -> None:
    with pytest.raises(VerifierError, match="not a finite number"):
        await _command(runtime, """echo '{"reward": NaN}'""", reward_from="stdout")


async def test_rewards_are_clamped_to_the_declared_range(runtime: HostRuntime) -> None:
    reward, details = await _command(runtime, "true", score="echo 7 > $LODESTAR_REWARD_FILE")
    assert (reward, details["reward_clamped_from"]) == (1.0, 7.0)
    reward, details = await _command(runtime, "true", score="echo 7 > $LODESTAR_REWARD_FILE", reward_range=[0, 10])
    assert reward == 7.0
    assert "reward_clamped_from" not in details


async def test_the_node_never_writes_through_a_planted_symlink(runtime: HostRuntime, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    tmpdir = runtime.real.tmpdir
    (tmpdir / "lodestar-verifier-input.json").symlink_to(victim / "owned.json")  # the old fixed input name
    spec = rollout_pb2.VerifierSpec(kind="python")
    spec.config.update({"function": "tests.gateway.node.verifier_functions:file_matches_answer"})
    task_metadata_given = _given(runtime)
    task_metadata_given.task.metadata.update({"expected": "x"})
    assert (await make_verifier(spec).score(task_metadata_given)).reward == 0.0
    assert list(victim.iterdir()) == []

    os.rename(tmpdir, tmpdir.with_name("tmp-moved"))
    tmpdir.symlink_to(victim, target_is_directory=True)  # the whole TMPDIR is a link to a host directory
    with pytest.raises(SessionFileError, match="not a directory"):
        await make_verifier(spec).score(task_metadata_given)
    assert list(victim.iterdir()) == []


async def test_a_module_planted_in_the_nodes_directory_does_not_shadow_the_verifier(
    runtime: HostRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "node-cwd"
    planted.mkdir()
    (planted / "planted_verifier.py").write_text("def score(workspace, task, answer):\n    return 1.0\n")
    monkeypatch.chdir(planted)
    spec = rollout_pb2.VerifierSpec(kind="python")
    spec.config.update({"function": "planted_verifier:score"})
    with pytest.raises(VerifierError, match="ModuleNotFoundError"):
        await make_verifier(spec).score(_given(runtime))
