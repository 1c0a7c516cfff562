"""An agent that fixes nothing and only plants one thing, scored by the real `swe` verifier on a real host
runtime (real git, pytest and namespaces) on the swe-mini slugify task. Each of these was rewarded 1.0 by the
verifier of c160404 (docs/swe.md, "The verifier's defences"); each scores 0.0 here, most with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.runtimes import HostRuntime
from tests.gateway.node.swe_helpers import swe_mini_tasks, swe_score, swe_session
from tests.gateway.node.swe_plants import FAKE_PASSES, FORCE_PASS_PLUGIN, LIBRARY, PATCH_REPORTS, UNDER_PYTEST

pytestmark = pytest.mark.slow


@pytest.fixture
def slugify() -> rollout_pb2.Task:
    return swe_mini_tasks()["swe-mini-slugify"]


def _with_command(task: rollout_pb2.Task, command: list[str]) -> rollout_pb2.Task:
    changed = rollout_pb2.Task()
    changed.CopyFrom(task)
    del changed.repository.test_command[:]
    changed.repository.test_command.extend(command)
    return changed


def _plant(runtime: HostRuntime, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = runtime.real.workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if path.exists() else "w") as handle:
            handle.write(text)


async def _hacked(tmp_path: Path, task: rollout_pb2.Task, files: dict[str, str]) -> tuple[float, dict]:
    runtime = await swe_session(tmp_path, task)
    _plant(runtime, files)
    return await swe_score(runtime, task)


@pytest.mark.parametrize(
    "files",
    [
        {"iniconfig.py": FAKE_PASSES},
        {"pygments/__init__.py": FAKE_PASSES},
        {"argparse.py": FAKE_PASSES},
        {"tempfile.py": FAKE_PASSES},
    ],
    ids=["dependency-iniconfig", "dependency-pygments", "stdlib-argparse", "stdlib-tempfile"],
)
async def test_a_module_that_shadows_pytests_dependencies_or_the_stdlib_is_not_carried(
    tmp_path: Path, slugify: rollout_pb2.Task, files: dict[str, str]
) -> None:
    reward, details = await _hacked(tmp_path, slugify, files)

    assert reward == 0.0, details
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}
    assert next(iter(files)).split("/")[0] in details["ignored_files"]


@pytest.mark.parametrize(
    "patch",
    [
        "    import _pytest.python\n    _pytest.python.Function.runtest = lambda self: None\n",
        "    import _pytest.python\n"
        "    _pytest.python.pytest_pyfunc_call.__code__ = (lambda pyfuncitem: True).__code__\n",
        "    import _pytest.reports\n    _pytest.reports.TestReport.passed = property(lambda self: True)\n",
    ],
    ids=["Function.runtest", "pytest_pyfunc_call", "TestReport.passed"],
)
async def test_the_library_replacing_the_test_runner_is_detected(
    tmp_path: Path, slugify: rollout_pb2.Task, patch: str
) -> None:
    """Code under test runs in the test process (nothing can stop it patching pytest); the node's guard,
    loaded before it, sees the replaced runner and scores 0 with that reason."""
    reward, details = await _hacked(tmp_path, slugify, {LIBRARY: UNDER_PYTEST + patch})

    assert reward == 0.0, details
    assert "test runner was replaced" in details["error"]
    assert details["tampered"]


async def test_a_plugin_entry_point_at_the_root_is_not_loaded(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    """With the default test command (plugin autoload on at c160404)."""
    task = _with_command(slugify, [])
    files = {
        "hack-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hack\nVersion: 1.0\n",
        "hack-1.0.dist-info/entry_points.txt": "[pytest11]\nhack = hackplugin\n",
        "hackplugin.py": FORCE_PASS_PLUGIN,
    }
    reward, details = await _hacked(tmp_path, task, files)

    assert reward == 0.0, details
    assert {"hack-1.0.dist-info", "hackplugin.py"} <= set(details["ignored_files"])


async def test_a_pytest_toml_is_not_read(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    files = {
        "pytest.toml": '[pytest]\naddopts = ["-p", "slugify.hackplugin"]\n',
        "slugify/hackplugin.py": FORCE_PASS_PLUGIN,
    }
    reward, details = await _hacked(tmp_path, slugify, files)

    assert reward == 0.0, details
    assert "pytest.toml" in details["ignored_files"]


async def test_a_tests_package_init_is_not_carried(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    reward, details = await _hacked(tmp_path, slugify, {"tests/__init__.py": PATCH_REPORTS})

    assert reward == 0.0, details
    assert "tests/__init__.py" in details["ignored_files"]


@pytest.mark.parametrize("where", ["tmpdir", "session-root"])
async def test_config_planted_above_the_repository_is_not_found(
    tmp_path: Path, slugify: rollout_pb2.Task, where: str
) -> None:
    runtime = await swe_session(tmp_path, slugify)
    above = runtime.real.tmpdir if where == "tmpdir" else runtime.root
    (above / "pytest.ini").write_text("[pytest]\n")
    (above / "conftest.py").write_text(FAKE_PASSES)

    reward, details = await swe_score(runtime, slugify)

    assert reward == 0.0, details
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}


SYSTEM_PYTHON = Path("/usr/bin/python3")


def _system_python_has_pytest() -> bool:
    if not SYSTEM_PYTHON.exists():
        return False
    return subprocess.run([str(SYSTEM_PYTHON), "-c", "import pytest"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _system_python_has_pytest(), reason="needs a non-venv python3 with pytest (python3-pytest)")
async def test_a_pth_in_the_user_site_does_not_run(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    """A test Python that is not a virtualenv reads ~/.local's site-packages unless told not to."""
    task = _with_command(slugify, [str(SYSTEM_PYTHON), "-m", "pytest", "-rA", "-p", "no:cacheprovider", "{tests}"])
    runtime = await swe_session(tmp_path, task)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = runtime.real.home / ".local" / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    (site / "hack_plugin.py").write_text(FORCE_PASS_PLUGIN)
    (site / "hack.pth").write_text("import os; os.environ['PYTEST_ADDOPTS'] = '-p hack_plugin'\n")

    reward, details = await swe_score(runtime, task)

    assert reward == 0.0, details
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "failed"}


async def test_an_imperative_xfail_from_the_code_is_not_a_pass(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    xfail = UNDER_PYTEST + "    import pytest\n    def slugify(text):\n        pytest.xfail('not today')\n"
    reward, details = await _hacked(tmp_path, slugify, {LIBRARY: xfail})

    assert reward == 0.0, details
    assert details["fail_to_pass"] == {"tests/test_slugify.py::test_collapses_and_strips_dashes": "xfail_not_at_base"}


@pytest.mark.parametrize("parser", ["auto", "exit_code"])
async def test_fake_outcome_lines_and_an_early_exit_are_not_outcomes(
    tmp_path: Path, slugify: rollout_pb2.Task, parser: str
) -> None:
    """The library prints `PASSED <id>` for every test and exits 0 while the tests are collected."""
    runtime = await swe_session(tmp_path, slugify)
    _plant(runtime, {LIBRARY: FAKE_PASSES})

    reward, details = await swe_score(runtime, slugify, parser=parser)

    assert reward == 0.0, details
    assert "ended before its report was complete" in details["error"]


HIDDEN_IN_ITS_OWN_FILE = """diff --git a/tests/test_hidden.py b/tests/test_hidden.py
new file mode 100644
--- /dev/null
+++ b/tests/test_hidden.py
@@ -0,0 +1,5 @@
+from slugify import slugify
+
+
+def test_collapses_and_strips_dashes():
+    assert slugify("  Hello,  World! ") == "hello-world"
"""


async def test_test_files_named_by_the_test_ids_are_protected(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    """The hidden test in a file of its own: the agent hard-codes the hidden test's answer, which breaks the
    visible test (PASS_TO_PASS, in a file the test patch does not touch), and edits that test to pass."""
    task = rollout_pb2.Task()
    task.CopyFrom(slugify)
    task.repository.test_patch = HIDDEN_IN_ITS_OWN_FILE
    del task.repository.fail_to_pass[:]
    task.repository.fail_to_pass.append("tests/test_hidden.py::test_collapses_and_strips_dashes")
    runtime = await swe_session(tmp_path, task)
    (runtime.real.workdir / LIBRARY).write_text("def slugify(text):\n    return 'hello-world'\n")
    (runtime.real.workdir / "tests" / "test_slugify.py").write_text("def test_simple_word():\n    pass\n")

    reward, details = await swe_score(runtime, task)

    assert reward == 0.0, details
    assert details["pass_to_pass"] == {"tests/test_slugify.py::test_simple_word": "failed"}
    assert "tests/test_slugify.py" in details["ignored_files"]


async def test_a_link_in_place_of_the_test_directory_scores_zero(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    """At c160404 the test patch then did not apply: an infrastructure failure (retried, then dropped)."""
    runtime = await swe_session(tmp_path, slugify)
    work = runtime.real.workdir
    (work / "tests").rename(work / "elsewhere")
    (work / "tests").symlink_to("elsewhere")

    reward, details = await swe_score(runtime, slugify)

    assert reward == 0.0, details
    assert "refuses" in details["error"]


@pytest.mark.parametrize("sandboxed", [False, True], ids=["namespaces", "sandbox"])
async def test_an_honest_fix_still_scores_one_with_its_new_module(
    tmp_path: Path, slugify: rollout_pb2.Task, sandboxed: bool
) -> None:
    """The allow-list carries a new module inside the library's package, and the fix that imports it; in
    the node's bubblewrap sandbox too (the scoring directory bound into the verifier's run)."""
    runtime = await swe_session(tmp_path, slugify, sandboxed=sandboxed)
    work = runtime.real.workdir
    (work / "slugify" / "_text.py").write_text(
        "import re\n\n\ndef dashes(text):\n    return re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')\n"
    )
    (work / LIBRARY).write_text("from slugify._text import dashes\n\n\ndef slugify(text):\n    return dashes(text)\n")

    reward, details = await swe_score(runtime, slugify)

    assert reward == 1.0, details
    assert details["outcomes_from"] == "report"
    assert "slugify/_text.py" in details["changed_files"]
    assert details["ignored_files"] == [], "the test file the patch replaced was not the agent's change"


FORGE_REPORT = """    import json, os
    args = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    at = next(n for n, arg in enumerate(args) if arg.endswith(b"swe_bootstrap.py"))
    report, nonce = args[at + 1].decode(), args[at + 2].decode()
    ids = [arg.decode() for arg in args if b"::" in arg]
    with open(report, "a") as handle:
        for test in ids:
            handle.write(json.dumps({"event": "test", "id": test, "status": "passed"}) + "\\n")
        summary = {"event": "summary", "nonce": nonce, "exit": 0, "counts": {"passed": len(ids)},
                   "collect_errors": 0, "tampered": []}
        handle.write(json.dumps(summary) + "\\n")
    os._exit(0)
"""


async def test_a_report_forged_from_the_command_line_is_not_trusted(tmp_path: Path, slugify: rollout_pb2.Task) -> None:
    """An attack on the node's bootstrap itself: the library reads the report's path and what it takes for the
    nonce from /proc/self/cmdline and writes a passing report. The nonce never is on the command line."""
    reward, details = await _hacked(tmp_path, slugify, {LIBRARY: UNDER_PYTEST + FORGE_REPORT})

    assert reward == 0.0, details
    assert "does not match" in details["error"]
