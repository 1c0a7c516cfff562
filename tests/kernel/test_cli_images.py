"""`lodestar images build-task` and the task-set inputs of `lodestar eval`, without building anything: the
default tag, the docker argv, the refusals (no Dockerfile, a missing base image), and how `eval` reads a
task-set directory and its --runtime/--image flags. The real build of examples/swe-mini runs in
tests/e2e/test_swe_docker.py (docker marker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar_app.cli.eval import _spec, tasks_path
from lodestar_app.cli.images import build_argv, default_tag
from lodestar_app.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]


def test_default_tag_and_build_argv(tmp_path: Path):
    assert default_tag(REPO / "examples" / "swe-mini") == "lodestar/task-swe-mini:dev"
    assert default_tag(tmp_path / "My Tasks!") == "lodestar/task-my-tasks:dev"
    argv = build_argv(Path("/d/Dockerfile"), Path("/ctx"), "lodestar/session-base:dev", "t:1")
    assert argv[:3] == ["docker", "build", "--quiet"]
    assert "--pull=false" in argv
    assert argv[argv.index("--build-arg") + 1] == "BASE=lodestar/session-base:dev"
    assert argv[-3:] == ["-t", "t:1", "/ctx"]


def _lodestar(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", *argv], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_build_task_refuses_a_directory_without_dockerfile(tmp_path: Path):
    done = _lodestar("images", "build-task", str(tmp_path))
    assert done.returncode == 2
    assert "has no Dockerfile" in done.stderr


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
@pytest.mark.slow
def test_build_task_names_the_missing_base_image(tmp_path: Path):
    (tmp_path / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\n")
    done = _lodestar("images", "build-task", str(tmp_path), "--base", "lodestar/no-such-base:never")
    assert done.returncode == 2
    assert "lodestar/no-such-base:never is not on this Docker daemon" in done.stderr
    assert "make session-image" in done.stderr


def test_eval_reads_a_task_set_directory_with_runtime_flags(tmp_path: Path):
    swe_mini = REPO / "examples" / "swe-mini"
    assert tasks_path(swe_mini) == swe_mini / "run.yaml"
    args = build_parser().parse_args(["eval", str(swe_mini), "--harness", "command", "--runtime", "docker"])

    spec = _spec(args)

    assert len(spec.tasks) == 10
    assert spec.verifier.kind == "swe"
    assert (spec.runtime.kind, spec.runtime.image) == ("docker", "lodestar/task-swe-mini:dev")
    assert spec.tasks[0].repository.source == str(swe_mini / "repos" / "slugify.bundle")
    (tmp_path / "tasks.jsonl").write_text((swe_mini / "tasks.jsonl").read_text())
    args = build_parser().parse_args(["eval", str(tmp_path), "--harness", "command", "--verifier", "swe",
                                      "--image", "mine:1"])  # fmt: skip
    only_jsonl = _spec(args)
    assert only_jsonl.name == tmp_path.name
    assert (only_jsonl.runtime.kind, only_jsonl.runtime.image) == ("", "mine:1")
    assert only_jsonl.tasks[0].repository.source == str(tmp_path / "repos" / "slugify.bundle")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="has none of"):
        tasks_path(tmp_path / "empty")
