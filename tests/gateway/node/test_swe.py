"""Repository tasks and the `swe` verifier on a real session runtime: real git, real pytest, the swe-mini
repositories (examples/swe-mini). The workspace holds the base commit only; the hidden tests arrive after
the agent; FAIL_TO_PASS / PASS_TO_PASS decide the reward; test files the agent edited are restored; a test
run that hangs or reports nothing scores 0 (the agent's code ran there); one that cannot start is
infrastructure (VerifierError)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import HostBackend, HostRuntime
from lodestar_gateway.node.verifiers import VerifierError, make_verifier
from tests.gateway.node.swe_helpers import SWE_MINI, swe_mini_tasks, swe_score, swe_session


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def _git_fails(cwd: Path, *args: str) -> bool:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True).returncode != 0


def _agent_applies(runtime: HostRuntime, patch: str) -> None:
    subprocess.run(["git", "apply"], input=patch, text=True, cwd=runtime.real.workdir, check=True)


@pytest.fixture
def slugify() -> rollout_pb2.Task:
    return swe_mini_tasks()["swe-mini-slugify"]


async def test_workspace_holds_the_base_commit_only(tmp_path: Path, slugify: rollout_pb2.Task):
    work = (await swe_session(tmp_path, slugify)).real.workdir

    assert git(work, "rev-parse", "HEAD").strip() == slugify.repository.base_commit
    assert git(work, "status", "--porcelain") == ""
    assert git(work, "rev-list", "--all").split() == [slugify.repository.base_commit]
    assert git(work, "for-each-ref") == "", "no branches, tags or remotes"
    assert git(work, "remote") == ""
    assert _git_fails(work, "symbolic-ref", "-q", "HEAD"), "HEAD is detached"
    assert "test_collapses_and_strips_dashes" not in (work / "tests" / "test_slugify.py").read_text()
    assert not list(work.parent.glob(".lodestar-clone-*")), "the scratch clone is gone"


async def test_later_history_is_not_in_the_workspace(tmp_path: Path):
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    git(upstream, "init", "-q")
    for message in ("base", "the fix"):
        (upstream / "lib.py").write_text(f"# {message}\n")
        git(upstream, "add", "lib.py")
        git(upstream, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    base, fix = git(upstream, "rev-list", "HEAD").split()[::-1]
    git(upstream, "tag", "v1", fix)
    task = rollout_pb2.Task(
        task_id="t", repository=rollout_pb2.RepositoryTask(source=str(upstream), base_commit=base[:10], path="src")
    )
    runtime = await HostBackend(tmp_path / "sessions", Launcher()).create("s-a1", {"NOTES.md": "hi"})

    repo = await prepare_repository(task.repository, runtime.real.workdir)

    assert repo == runtime.real.workdir / "src"
    assert (repo / "lib.py").read_text() == "# base\n"
    assert (runtime.real.workdir / "NOTES.md").read_text() == "hi"
    assert git(repo, "rev-list", "--all").split() == [base]
    assert _git_fails(repo, "cat-file", "-e", fix), "the later commit is not in the workspace"
    assert git(repo, "config", "user.name").strip() == "lodestar"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_commit": ""}, "no base_commit"),
        ({"base_commit": "0123456789abcdef0123456789abcdef01234567"}, "not in"),
        ({"source": "/nonexistent/repo.bundle"}, "does not exist"),
        ({"path": "../outside"}, "stay inside"),
    ],
)
async def test_bad_repository_data_is_refused(tmp_path: Path, slugify: rollout_pb2.Task, change, message):
    repo = rollout_pb2.RepositoryTask()
    repo.CopyFrom(slugify.repository)
    for field, value in change.items():
        setattr(repo, field, value)
    with pytest.raises(InvalidArgumentError, match=message):
        await prepare_repository(repo, tmp_path / "work")


@pytest.mark.slow
async def test_unfixed_repository_scores_zero_with_per_test_outcomes(tmp_path: Path, slugify: rollout_pb2.Task):
    runtime = await swe_session(tmp_path, slugify)

    reward, details = await swe_score(runtime, slugify)

    assert reward == 0.0
    assert details["resolved"] is False
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}
    assert details["pass_to_pass"] == {"tests/test_slugify.py::test_simple_word": "passed"}
    assert details["restored_files"] == ["tests/test_slugify.py"]


@pytest.mark.parametrize("pristine", [True, False])
@pytest.mark.slow
async def test_the_fix_scores_one_and_edited_test_files_are_restored(
    tmp_path: Path, slugify: rollout_pb2.Task, pristine: bool
):
    runtime = await swe_session(tmp_path, slugify)
    _agent_applies(runtime, slugify.metadata["gold_patch"])
    # The agent also "fixes" the tests its own way: a syntax error that would fail every test if it stayed.
    (runtime.real.workdir / "tests" / "test_slugify.py").write_text("this is not python\n")

    reward, details = await swe_score(runtime, slugify, pristine=pristine)

    assert reward == 1.0, details
    assert set(details["fail_to_pass"].values()) == set(details["pass_to_pass"].values()) == {"passed"}
    if pristine:  # scored on a fresh checkout: the agent's edit of the test file was never carried over
        assert details["scored_on"] == "pristine"
        assert details["ignored_files"] == ["tests/test_slugify.py"]
        assert details["changed_files"] == ["slugify/__init__.py"]
        return
    test_file = (runtime.real.workdir / "tests" / "test_slugify.py").read_text()
    assert "def test_simple_word" in test_file
    assert "def test_collapses_and_strips_dashes" in test_file


@pytest.mark.slow
async def test_an_agent_cannot_fake_the_hidden_test(tmp_path: Path, slugify: rollout_pb2.Task):
    """The agent writes a trivially passing test under the hidden test's name: the patch's version wins."""
    runtime = await swe_session(tmp_path, slugify)
    test_file = runtime.real.workdir / "tests" / "test_slugify.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_collapses_and_strips_dashes():\n    pass\n")

    reward, details = await swe_score(runtime, slugify)

    assert reward == 0.0
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}


@pytest.mark.slow
async def test_breaking_a_passing_test_scores_zero_even_with_partial_credit(tmp_path: Path, slugify: rollout_pb2.Task):
    runtime = await swe_session(tmp_path, slugify)
    # Makes the hidden test pass and breaks the visible one.
    (runtime.real.workdir / "slugify" / "__init__.py").write_text("def slugify(text):\n    return 'hello-world'\n")

    reward, details = await swe_score(runtime, slugify)
    partial, _ = await swe_score(runtime, slugify, partial_credit=True)

    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "passed"}
    assert details["pass_to_pass"] == {"tests/test_slugify.py::test_simple_word": "failed"}
    assert (reward, partial) == (0.0, 0.0)


@pytest.mark.slow
async def test_partial_credit_counts_passing_fail_to_pass_tests(tmp_path: Path, slugify: rollout_pb2.Task):
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    task.repository.fail_to_pass.append("tests/test_slugify.py::test_simple_word")  # passes already
    runtime = await swe_session(tmp_path, task)

    assert (await swe_score(runtime, task))[0] == 0.0
    assert (await swe_score(runtime, task, partial_credit=True))[0] == 0.5


async def test_an_agent_that_destroys_the_repository_scores_zero(tmp_path: Path, slugify: rollout_pb2.Task):
    runtime = await swe_session(tmp_path, slugify)
    shutil.rmtree(runtime.real.workdir / ".git")

    reward, details = await swe_score(runtime, slugify, pristine=False)

    assert reward == 0.0
    assert "no longer a git repository" in details["error"]
    shutil.rmtree(runtime.real.workdir)
    reward, details = await swe_score(runtime, slugify)
    assert reward == 0.0
    assert details["error"] == "the repository directory is gone"


@pytest.mark.parametrize(
    ("test_command", "config", "message"),
    [
        (["bash", "-c", "sleep 30"], {"timeout_s": 1}, "did not finish in 1 s"),
        (["bash", "-c", "kill -KILL $$"], {}, "killed by signal 9"),
        (["python", "-c", "print('no tests here')"], {}, "no test outcome"),
        (["python", "-m", "pytest", "--collect-only", "{tests}"], {}, "no test outcome"),
    ],
    ids=["hangs", "killed", "no-outcome", "pytest-no-outcome"],
)
async def test_a_test_run_the_agent_broke_scores_zero_with_its_reason(
    tmp_path: Path, slugify: rollout_pb2.Task, test_command, config, message
):
    """Tests that hang, die by a signal or report nothing are the agent's doing (its code runs there): 0.0,
    never an infrastructure failure that would be retried and dropped."""
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    del task.repository.test_command[:]
    task.repository.test_command.extend(test_command)
    runtime = await swe_session(tmp_path, task)

    reward, details = await swe_score(runtime, task, **config)

    assert reward == 0.0
    assert message in details["error"]


async def test_a_test_command_that_cannot_start_is_infrastructure(tmp_path: Path, slugify: rollout_pb2.Task):
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    del task.repository.test_command[:]
    task.repository.test_command.extend(["no-such-test-runner", "{tests}"])
    runtime = await swe_session(tmp_path, task)

    with pytest.raises(VerifierError, match="could not run"):
        await swe_score(runtime, task)


def _without_git(directory: Path) -> Path:
    """A directory of links to every program in /usr/bin but git."""
    directory.mkdir()
    for program in Path("/usr/bin").iterdir():
        if not program.name.startswith("git"):
            (directory / program.name).symlink_to(program)
    return directory


async def test_a_runtime_without_git_is_infrastructure(tmp_path: Path, slugify: rollout_pb2.Task):
    """In place (an in-image repository), git runs in the session's runtime; on a pristine tree the node's
    git does the work, and the test run needs none."""
    runtime = await swe_session(tmp_path, slugify)
    no_git = _without_git(tmp_path / "bin-without-git")

    with pytest.raises(VerifierError, match="git is not installed"):
        await swe_score(runtime, slugify, pristine=False, env={"PATH": str(no_git)})


@pytest.mark.parametrize("pristine", [True, False])
async def test_a_test_patch_that_does_not_apply_is_infrastructure(
    tmp_path: Path, slugify: rollout_pb2.Task, pristine: bool
):
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    task.repository.test_patch = task.repository.test_patch.replace("def test_simple_word", "def test_other_name")
    runtime = await swe_session(tmp_path, task)

    with pytest.raises(VerifierError, match="does not apply"):
        await swe_score(runtime, task, pristine=pristine)


@pytest.mark.slow
async def test_exit_code_parser(tmp_path: Path, slugify: rollout_pb2.Task):
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    del task.repository.test_command[:]
    task.repository.test_command.extend(
        ["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "python", "-m", "pytest", "-q", "{tests}"]
    )
    runtime = await swe_session(tmp_path, task)

    assert (await swe_score(runtime, task, parser="exit_code"))[0] == 0.0
    _agent_applies(runtime, slugify.metadata["gold_patch"])
    reward, details = await swe_score(runtime, task, parser="exit_code")
    assert reward == 1.0
    assert details["exit_code"] == 0


@pytest.mark.parametrize("config", [{"parser": "junit"}, {"partial_credit": "yes"}, {"timeout_s": -1}, {"env": []}])
def test_bad_config_is_refused(config: dict[str, Any]):
    spec = rollout_pb2.VerifierSpec(kind="swe")
    spec.config.update(config)
    with pytest.raises(InvalidArgumentError):
        make_verifier(spec)


async def test_a_task_without_repository_is_infrastructure(tmp_path: Path):
    runtime = await HostBackend(tmp_path / "sessions", Launcher()).create("s-a1", {})
    with pytest.raises(VerifierError, match="no repository"):
        await swe_score(runtime, rollout_pb2.Task(task_id="plain"))


@pytest.mark.slow
async def test_every_swe_mini_task_fails_unfixed_and_passes_with_its_gold_patch(tmp_path: Path):
    """The bundled set is well-formed: each hidden test fails at the base commit, the gold patch fixes it,
    and the visible test passes both times."""
    scores: dict[str, tuple[float, float]] = {}
    for number, (task_id, task) in enumerate(swe_mini_tasks().items()):
        runtime = await swe_session(tmp_path, task, name=f"s{number}-a1")
        before, details = await swe_score(runtime, task)
        assert set(details["pass_to_pass"].values()) == {"passed"}, (task_id, details["output_tail"])
        _agent_applies(runtime, task.metadata["gold_patch"])
        after, details = await swe_score(runtime, task)
        scores[task_id] = (before, after)
        await runtime.cleanup()
    assert len(scores) == 10
    assert scores == dict.fromkeys(scores, (0.0, 1.0)), json.dumps(scores)


@pytest.mark.slow
def test_swe_mini_tasks_are_what_make_tasks_builds():
    """tasks.jsonl (base commits, test and gold patches) is reproducible from repos.py on this machine."""
    done = subprocess.run(
        ["python3", str(SWE_MINI / "make_tasks.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
