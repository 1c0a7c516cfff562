"""Repository tasks on the `docker` runtime (marker `docker`): `lodestar images build-task examples/swe-mini`
builds the task image FROM lodestar/session-base offline; a session container from it gets the repository
checked out by INIT into its mounted workspace; the `swe` verifier runs inside the container with the image's
python (pytest from the wheelhouse, not the node's); unfixed 0.0, fixed (inside the container) 1.0."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from lodestar.v1 import rollout_pb2
from lodestar_app.cli.images import build_task_image
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import DockerBackend, DockerRuntime
from lodestar_gateway.node.verifiers import VerifierInput, make_verifier
from tests.docker_support import SESSION_IMAGE, containers, remove, skip_reason
from tests.gateway.node.swe_plants import FAKE_PASSES, FORCE_PASS_PLUGIN, LIBRARY, PATCH_REPORTS, UNDER_PYTEST

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SWE_MINI = Path(__file__).resolve().parents[3] / "examples" / "swe-mini"
TASK_IMAGE = "lodestar/task-swe-mini:dev"


@pytest.fixture(scope="module")
def task_image() -> str:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return build_task_image(SWE_MINI, base=SESSION_IMAGE, tag=TASK_IMAGE, log=False)


@pytest.fixture
async def backend(tmp_path: Path, task_image: str) -> AsyncIterator[DockerBackend]:
    made = DockerBackend(tmp_path / "sessions", node_id=f"swe-{uuid.uuid4().hex[:6]}")
    try:
        yield made
    finally:
        await made.close()
        remove(containers(made.owner_label))


def _task(task_id: str) -> rollout_pb2.Task:
    for line in (SWE_MINI / "tasks.jsonl").read_text().splitlines():
        task = json_format.Parse(line, rollout_pb2.Task())
        if task.task_id == task_id:
            task.repository.source = str(SWE_MINI / task.repository.source)
            return task
    raise AssertionError(task_id)


async def _score(
    runtime: DockerRuntime, task: rollout_pb2.Task, *, pristine: bool = False
) -> tuple[float, dict[str, Any]]:
    """The swe verdict as the node gives it: on a pristine checkout with the agent's changes carried over
    (`pristine`, the node's path for repositories it checked out), else in the agent's own tree."""
    given = VerifierInput(task=task, final_answer="done", workspace=runtime.visible.workdir, timed_out=False,
                          run=runtime.run_process, scratch=runtime.real.tmpdir,
                          scratch_visible=runtime.visible.tmpdir, runtime_kind=runtime.kind, root=runtime.root,
                          workspace_host=runtime.real.workdir if pristine else None,
                          owner=runtime.owner)  # fmt: skip
    verdict = await make_verifier(rollout_pb2.VerifierSpec(kind="swe")).score(given)
    return verdict.reward, verdict.details


async def test_swe_verifier_in_a_task_image_container(backend: DockerBackend, task_image: str):
    task = _task("swe-mini-roman")
    del task.repository.test_command[:]  # the same pytest run, saying which python ran it
    task.repository.test_command.extend(
        ["bash", "-c", "command -v python; python -m pytest -rA -p no:cacheprovider {tests}"]
    )
    runtime = await backend.create("s1-a1", {}, rollout_pb2.RuntimeSpec(kind="docker", image=task_image))
    try:
        await prepare_repository(task.repository, runtime.real.workdir)
        head = await runtime.run_process(["git", "rev-parse", "HEAD"], {}, 30)
        assert head.stdout.strip() == task.repository.base_commit, head.stderr

        before, details = await _score(runtime, task)
        assert before == 0.0
        assert details["fail_to_pass"] == {"tests/test_roman.py::test_subtractive_numerals": "failed"}
        assert details["pass_to_pass"] == {"tests/test_roman.py::test_additive_numerals": "passed"}
        assert "/opt/swe-mini/bin/python" in details["output_tail"], "the image's python ran the tests"

        (runtime.real.tmpdir / "fix.patch").write_text(task.metadata["gold_patch"])
        fixed = await runtime.run_process(["git", "apply", str(runtime.visible.tmpdir / "fix.patch")], {}, 30)
        assert fixed.returncode == 0, fixed.stderr
        after, details = await _score(runtime, task)
        assert after == 1.0, details["output_tail"]
    finally:
        await runtime.cleanup()
    assert containers(backend.owner_label) == []


async def test_a_repository_already_in_the_image(backend: DockerBackend, task_image: str):
    """Empty `source`, absolute `path`: INIT copies nothing; the verifier works on the image's repository."""
    task = _task("swe-mini-flatten")
    task.repository.source = ""
    task.repository.path = "/opt/swe-mini/repos/flatten"
    runtime = await backend.create("s2-a1", {}, rollout_pb2.RuntimeSpec(kind="docker", image=task_image))
    try:
        assert await prepare_repository(task.repository, runtime.real.workdir) is None
        assert list(runtime.real.workdir.iterdir()) == []

        assert (await _score(runtime, task))[0] == 0.0
        (runtime.real.tmpdir / "fix.patch").write_text(task.metadata["gold_patch"])
        fix = ["git", "-C", task.repository.path, "apply", str(runtime.visible.tmpdir / "fix.patch")]
        assert (await runtime.run_process(fix, {}, 30)).returncode == 0
        reward, details = await _score(runtime, task)
        assert reward == 1.0, details["output_tail"]
    finally:
        await runtime.cleanup()


PLANT_FAKE_PYTEST = r"""
from pathlib import Path
Path("pytest.py").write_text('import sys\nfor arg in sys.argv[1:]:\n    print("PASSED " + arg)\n')
Path("conftest.py").write_text(
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
"""


async def test_planted_test_infrastructure_scores_nothing_in_a_container(backend: DockerBackend, task_image: str):
    """The agent (the session's user, in its container) plants a fake `pytest.py` and a conftest forcing every
    test to pass: in its own tree that fools the tests (the control), the node's pristine scoring is not
    fooled, and the real fix still scores 1.0 there."""
    task = _task("swe-mini-roman")
    runtime = await backend.create("s3-a1", {}, rollout_pb2.RuntimeSpec(kind="docker", image=task_image))
    try:
        await prepare_repository(task.repository, runtime.real.workdir)
        planted = await runtime.run_process(["python3", "-c", PLANT_FAKE_PYTEST], {}, 30)
        assert planted.returncode == 0, planted.stderr

        assert (await _score(runtime, task))[0] == 1.0, "the control: the agent's own tree is fooled"
        honest, details = await _score(runtime, task, pristine=True)
        assert honest == 0.0, details
        assert {"pytest.py", "conftest.py"} <= set(details["ignored_files"])

        (runtime.real.tmpdir / "fix.patch").write_text(task.metadata["gold_patch"])
        fixed = await runtime.run_process(["git", "apply", str(runtime.visible.tmpdir / "fix.patch")], {}, 30)
        assert fixed.returncode == 0, fixed.stderr
        reward, details = await _score(runtime, task, pristine=True)
        assert reward == 1.0, details["output_tail"]
    finally:
        await runtime.cleanup()


RUNTEST_PATCH = "    import _pytest.python\n    _pytest.python.Function.runtest = lambda self: None\n"
XFAIL_PATCH = "    import pytest\n    def slugify(text):\n        pytest.xfail('not today')\n"
DOCKER_HACKS = {
    "dependency-shadow": {"iniconfig.py": FAKE_PASSES},
    "stdlib-shadow": {"argparse.py": FAKE_PASSES},
    "runner-patch": {LIBRARY: UNDER_PYTEST + RUNTEST_PATCH},
    "entry-point": {"hack-1.0.dist-info/entry_points.txt": "[pytest11]\nhack = hackplugin\n",
                    "hack-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hack\nVersion: 1.0\n",
                    "hackplugin.py": FORCE_PASS_PLUGIN},
    "pytest-toml": {"pytest.toml": '[pytest]\naddopts = ["-p", "slugify.hackplugin"]\n',
                    "slugify/hackplugin.py": FORCE_PASS_PLUGIN},
    "tests-init": {"tests/__init__.py": PATCH_REPORTS},
    "xfail": {LIBRARY: UNDER_PYTEST + XFAIL_PATCH},
    "fake-outcome": {LIBRARY: FAKE_PASSES},
    "config-above": {"../tmp/pytest.ini": "[pytest]\n", "../tmp/conftest.py": FAKE_PASSES},
}  # fmt: skip


@pytest.mark.parametrize("hack", list(DOCKER_HACKS))
async def test_known_hacks_score_zero_in_a_container(backend: DockerBackend, task_image: str, hack: str):
    """The hack kinds of test_swe_hacks.py (host runtime), planted in a docker session and scored in its
    container (the default pytest command, plugin autoload not disabled by the task)."""
    task = _task("swe-mini-slugify")
    del task.repository.test_command[:]
    runtime = await backend.create("s4-a1", {}, rollout_pb2.RuntimeSpec(kind="docker", image=task_image))
    try:
        await prepare_repository(task.repository, runtime.real.workdir)
        for name, text in DOCKER_HACKS[hack].items():
            path = runtime.real.workdir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as handle:
                handle.write(text)

        reward, details = await _score(runtime, task, pristine=True)

        assert reward == 0.0, details
    finally:
        await runtime.cleanup()
