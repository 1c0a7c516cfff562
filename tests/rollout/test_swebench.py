"""SWE-bench-format data in run specs: records -> Task + RepositoryTask (hand-written records in the dataset's
fields), the `tasks: {swebench: FILE}` mapping and its options, records inside a plain tasks JSONL, relative
repository sources, and the INVALID_ARGUMENT checks of repository tasks. The last test scores a record end
to end: the repository prepared from `repos_dir`, the swe verifier on the gold patch."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import HostBackend
from lodestar_gateway.node.verifiers import VerifierInput, make_verifier
from lodestar_rollout.spec import load_spec_file, read_tasks_jsonl
from lodestar_rollout.swebench import task_from_record

SWE_MINI = Path(__file__).resolve().parents[2] / "examples" / "swe-mini"
RECORD: dict[str, Any] = {
    "repo": "acme/widgets",
    "instance_id": "acme__widgets-42",
    "base_commit": "0123456789abcdef0123456789abcdef01234567",
    "patch": "diff --git a/widgets/core.py b/widgets/core.py\n--- a/widgets/core.py\n+++ b/widgets/core.py\n",
    "test_patch": "diff --git a/tests/test_core.py b/tests/test_core.py\n"
    "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n"
    "@@ -1 +1,2 @@\n",
    "problem_statement": "Widgets spin backwards.\n",
    "hints_text": "",
    "created_at": "2023-05-01T12:00:00Z",
    "version": "1.2",
    "FAIL_TO_PASS": '["tests/test_core.py::test_spin_direction"]',
    "PASS_TO_PASS": '["tests/test_core.py::test_create", "tests/test_core.py::test_repr"]',
    "environment_setup_commit": "fedcba9876543210fedcba9876543210fedcba98",
}


def _spec_file(tmp_path: Path, tasks: Any, verifier: str = "swe") -> Path:
    spec = {"name": "swe", "tasks": tasks, "groupSize": 2, "harness": {"kind": "command", "command": ["true"]},
            "verifier": {"kind": verifier}}  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_record_maps_to_a_repository_task(tmp_path: Path):
    task = task_from_record(RECORD, {"path": "/testbed", "image": "sweb.eval.x86_64.{instance_id}"}, tmp_path, "r")

    assert task.task_id == "acme__widgets-42"
    assert "Widgets spin backwards." in task.prompt
    assert "The repository acme/widgets is checked out in /testbed." in task.prompt
    assert task.image == "sweb.eval.x86_64.acme__widgets-42"
    repo = task.repository
    assert (repo.source, repo.path, repo.base_commit) == ("", "/testbed", RECORD["base_commit"])
    assert list(repo.fail_to_pass) == ["tests/test_core.py::test_spin_direction"]
    assert list(repo.pass_to_pass) == ["tests/test_core.py::test_create", "tests/test_core.py::test_repr"]
    assert list(repo.test_command) == ["python", "-m", "pytest", "-rA", "-p", "no:cacheprovider", "{tests}"]
    assert repo.test_patch == RECORD["test_patch"]
    assert repo.instance_id == "acme__widgets-42"
    assert task.metadata["patch"] == RECORD["patch"]
    assert task.metadata["environment_setup_commit"] == RECORD["environment_setup_commit"]
    assert task.metadata["version"] == "1.2"


def test_swebench_mapping_in_a_spec_with_options(tmp_path: Path):
    (tmp_path / "repos" / "acme__widgets").mkdir(parents=True)
    other = {**RECORD, "instance_id": "acme__gears-1", "repo": "acme/gears", "FAIL_TO_PASS": ["t::a"]}
    (tmp_path / "data.jsonl").write_text(json.dumps(RECORD) + "\n\n" + json.dumps(other) + "\n")
    (tmp_path / "repos" / "acme__gears.bundle").write_text("not really a bundle")
    tasks = {
        "swebench": "data.jsonl",
        "repos_dir": "repos",
        "prompt_template": "Fix {instance_id}: {problem_statement}",
        "test_commands": {"acme/gears": ["bash", "-c", "pytest {tests}"]},
    }

    spec = load_spec_file(_spec_file(tmp_path, tasks))

    first, second = spec.tasks
    assert first.prompt == "Fix acme__widgets-42: Widgets spin backwards.\n"
    assert first.repository.source == str(tmp_path / "repos" / "acme__widgets")
    assert second.repository.source == str(tmp_path / "repos" / "acme__gears.bundle")
    assert list(second.repository.test_command) == ["bash", "-c", "pytest {tests}"]
    assert list(second.repository.fail_to_pass) == ["t::a"]
    assert first.repository.path == ""
    limited = load_spec_file(_spec_file(tmp_path, {**tasks, "limit": 1}))
    assert [task.task_id for task in limited.tasks] == ["acme__widgets-42"]


def test_records_and_tasks_in_one_jsonl_with_relative_sources(tmp_path: Path):
    own = {"task_id": "mine", "prompt": "p", "repository": {"source": "repos/x.bundle", "base_commit": "abc",
           "fail_to_pass": ["t::a"]}}  # fmt: skip
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "tasks.jsonl"
    path.write_text(json.dumps(own) + "\n" + json.dumps({**RECORD, "repo": "a/b"}) + "\n")

    mine, record = read_tasks_jsonl(path)

    assert mine.repository.source == str(tmp_path / "sub" / "repos" / "x.bundle")
    assert record.task_id == "acme__widgets-42"
    assert record.repository.source == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_commit": ""}, "lacks base_commit"),
        ({"FAIL_TO_PASS": "[not json"}, "not a JSON list"),
        ({"PASS_TO_PASS": [1, 2]}, "list of test ids"),
    ],
)
def test_bad_records_are_invalid_argument(tmp_path: Path, change: dict[str, Any], message: str):
    (tmp_path / "data.jsonl").write_text(json.dumps({**RECORD, **change}) + "\n")
    with pytest.raises(InvalidArgumentError, match=message):
        load_spec_file(_spec_file(tmp_path, {"swebench": "data.jsonl", "path": "/testbed"}))


@pytest.mark.parametrize(
    ("tasks", "verifier", "message"),
    [
        ({"swebench": "data.jsonl"}, "swe", "absolute path in the image"),
        ({"swebench": "data.jsonl", "path": "/testbed", "colour": "red"}, "swe", "unknown options"),
        ({"swebench": "missing.jsonl"}, "swe", "cannot read"),
        ({"swebench": "data.jsonl", "path": "/testbed", "limit": 0}, "swe", "positive integer"),
        ([{"taskId": "plain", "prompt": "p"}], "swe", "needs a repository task"),
        ([{"taskId": "r", "repository": {"source": "/x", "fail_to_pass": ["a"]}}], "swe", "base_commit is required"),
        ([{"taskId": "r", "repository": {"source": "/x", "baseCommit": "abc"}}], "swe", "no FAIL_TO_PASS"),
        ([{"taskId": "r", "repository": {"source": "/x", "baseCommit": "a", "path": "../up"}}], "command", "inside"),
        (
            [
                {
                    "taskId": "r",
                    "repository": {
                        "source": "/x",
                        "baseCommit": "a",
                        "failToPass": ["t"],
                        "testPatch": "--- a/../../etc/x\n+++ b/../../etc/x\n",
                    },
                }
            ],
            "swe",
            "test patch names paths outside the repository: ../../etc/x",
        ),
    ],
)
def test_bad_repository_specs_are_invalid_argument(tmp_path: Path, tasks: Any, verifier: str, message: str):
    (tmp_path / "data.jsonl").write_text(json.dumps(RECORD) + "\n")
    with pytest.raises(InvalidArgumentError, match=message):
        load_spec_file(_spec_file(tmp_path, tasks, verifier))


def _git_apply(cwd: Path, patch: str) -> None:
    subprocess.run(["git", "apply"], input=patch, text=True, cwd=cwd, check=True)


@pytest.mark.slow
async def test_a_record_scores_end_to_end_from_repos_dir(tmp_path: Path):
    """A SWE-bench record built from swe-mini's slugify: repos_dir holds `lodestar__slugify.bundle`."""
    mini = json.loads((SWE_MINI / "tasks.jsonl").read_text().splitlines()[0])
    assert mini["task_id"] == "swe-mini-slugify"
    (tmp_path / "repos").mkdir()
    shutil.copy(SWE_MINI / "repos" / "slugify.bundle", tmp_path / "repos" / "lodestar__slugify.bundle")
    repo = mini["repository"]
    record = {"repo": "lodestar/slugify", "instance_id": "lodestar__slugify-1", "base_commit": repo["base_commit"],
              "problem_statement": mini["prompt"], "test_patch": repo["test_patch"],
              "patch": mini["metadata"]["gold_patch"], "FAIL_TO_PASS": json.dumps(repo["fail_to_pass"]),
              "PASS_TO_PASS": json.dumps(repo["pass_to_pass"])}  # fmt: skip
    (tmp_path / "data.jsonl").write_text(json.dumps(record) + "\n")
    (task,) = load_spec_file(_spec_file(tmp_path, {"swebench": "data.jsonl", "repos_dir": "repos"})).tasks
    runtime = await HostBackend(tmp_path / "sessions", Launcher()).create("s-a1", {})
    await prepare_repository(task.repository, runtime.real.workdir)
    _git_apply(runtime.real.workdir, task.metadata["patch"])

    verdict = await make_verifier(rollout_pb2.VerifierSpec(kind="swe")).score(
        VerifierInput(task=task, final_answer="", workspace=runtime.visible.workdir, timed_out=False,
                      run=runtime.run_process, scratch=runtime.real.tmpdir, scratch_visible=runtime.visible.tmpdir)
    )  # fmt: skip

    assert verdict.reward == 1.0, verdict.details
    assert verdict.details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "passed"}
