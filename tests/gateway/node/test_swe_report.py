"""The pure parts of the `swe` verifier's defences: which commands are pytest runs, the pinned argv, the
base commit's config, the bootstrap's report read back (complete, consistent, or why not), and the
allow-list of what is carried from the agent's tree."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lodestar_gateway.node.verifiers.swe_report import PytestRun, bootstrap_argv, find_config, pytest_run, read_report
from lodestar_gateway.node.verifiers.swe_tree import carry_changes

NONCE = "n0"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "-m", "pytest", "-rA", "t.py::a"], PytestRun([], "python", ["-rA", "t.py::a"])),
        (
            ["env", "A=1", "B=2", "python3.11", "-m", "pytest", "x"],
            PytestRun(["env", "A=1", "B=2"], "python3.11", ["x"]),
        ),
        (["pytest", "-q"], PytestRun([], "python", ["-q"])),
        (["/opt/venv/bin/pytest", "-q"], PytestRun([], "/opt/venv/bin/python", ["-q"])),
        (["bash", "-c", "pytest -rA x"], None),
        (["./tests/runtests.py", "--verbosity", "2"], None),
        (["python", "-m", "unittest", "x"], None),
        (["env", "A=1"], None),
    ],
)
def test_pytest_runs_are_recognized(argv: list[str], expected: PytestRun | None) -> None:
    assert pytest_run(argv) == expected


def test_the_bootstrap_argv_pins_rootdir_config_and_conftest_search() -> None:
    run = PytestRun(["env", "A=1"], "python", ["-rA", "t.py::a"])
    argv = bootstrap_argv(
        run, Path("/s/b.py"), Path("/s/r"), Path("/s/n"), Path("/s/repo"), Path("/s/c.ini"), Path("/s/repo")
    )
    assert argv == ["env", "A=1", "python", "-I", "/s/b.py", "/s/r", "/s/n", "/s/repo", "--", "--rootdir", "/s/repo",
                    "-c", "/s/c.ini", "--confcutdir", "/s/repo", "-rA", "t.py::a"]  # fmt: skip


def test_the_base_config_is_found_below_the_repository_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # above the repository: never
    assert find_config(repo, ["tests/unit/test_a.py::t"]) is None
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no pytest section: not a config
    (repo / "setup.cfg").write_text("[tool:pytest]\naddopts = -q\n")
    assert find_config(repo, ["tests/unit/test_a.py::t"]) == repo / "setup.cfg"
    (repo / "tests" / "tox.ini").write_text("[pytest]\n")
    assert find_config(repo, ["tests/unit/test_a.py::t", "tests/test_b.py::t"]) == repo / "tests" / "tox.ini"
    (repo / "pytest.toml").symlink_to(tmp_path / "pytest.ini")  # a link is never a config
    assert find_config(repo, ["test_c.py::t"]) == repo / "setup.cfg"


def _report(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


STARTED = {"event": "started"}


def _summary(exit_code: int, counts: dict[str, int], **more: Any) -> dict[str, Any]:
    return {"event": "summary", "nonce": NONCE, "exit": exit_code, "counts": counts, "collect_errors": 0,
            "tampered": [], **more}  # fmt: skip


def _test(test: str, status: str) -> dict[str, str]:
    return {"event": "test", "id": test, "status": status}


def test_a_complete_report_gives_the_outcomes() -> None:
    text = _report(STARTED, _test("a", "passed"), _test("b", "failed"), _summary(1, {"passed": 1, "failed": 1}))
    run = read_report(text, NONCE, 1)
    assert (run.error, run.infrastructure, run.outcomes) == (None, None, {"a": "passed", "b": "failed"})


@pytest.mark.parametrize(
    ("text", "returncode", "why"),
    [
        (_report(STARTED, _test("a", "passed")), 0, "before its report was complete"),
        (_report(STARTED, _test("a", "passed"), _summary(0, {"passed": 1}, nonce="forged")), 0, "does not match"),
        (_report(STARTED, _test("a", "passed"), _summary(0, {"passed": 1})), 3, "does not match"),
        (_report(STARTED, _test("a", "passed"), _summary(0, {"passed": 2})), 0, "does not match"),
        (_report(STARTED, _test("a", "failed"), _summary(0, {"failed": 1})), 0, "contradicts"),
        (_report(STARTED, _summary(0, {}), _test("a", "passed")), 0, "before its report was complete"),
        (_report(STARTED, STARTED, _test("a", "passed"), _summary(0, {"passed": 1})), 0, "complete"),
        (_report(STARTED) + "PASSED a\n", 0, "not JSON"),
    ],
    ids=["no-summary", "nonce", "exit", "counts", "exit-vs-outcomes", "after-summary", "two-starts", "text"],
)
def test_an_incomplete_or_inconsistent_report_is_the_agents_doing(text: str, returncode: int, why: str) -> None:
    run = read_report(text, NONCE, returncode)
    assert run.infrastructure is None
    assert run.error is not None
    assert why in run.error


@pytest.mark.parametrize(
    ("text", "returncode", "why"),
    [
        ("", 1, "did not start pytest"),
        (_report({"event": "setup_failed", "error": "ModuleNotFoundError: pytest"}), 3, "could not start"),
        (_report(STARTED, _summary(4, {})), 4, "refused its arguments"),
    ],
)
def test_a_run_that_never_reached_the_repository_is_infrastructure(text: str, returncode: int, why: str) -> None:
    run = read_report(text, NONCE, returncode)
    assert run.infrastructure is not None
    assert why in run.infrastructure


def test_a_tampered_run_is_reported() -> None:
    text = _report(STARTED, _test("a", "passed"), _summary(0, {"passed": 1}, tampered=["_pytest.python.Function"]))
    assert read_report(text, NONCE, 0).tampered == ["_pytest.python.Function"]


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


BASE = {"lib/__init__.py": "", "lib/core.py": "x = 1\n", "src/other/__init__.py": "", "tests/test_a.py": "",
        "README.md": "hi\n"}  # fmt: skip


def test_only_changes_to_code_are_carried(tmp_path: Path) -> None:
    agent, pristine = tmp_path / "agent", tmp_path / "pristine"
    _tree(agent, BASE)
    _tree(pristine, BASE)
    _tree(agent, {
        "lib/core.py": "x = 2\n", "lib/new.py": "", "lib/sub/__init__.py": "", "lib/sub/deep.py": "",
        "argparse.py": "", "packaging/__init__.py": "", "notes.txt": "", "src/typing.py": "", "tests/__init__.py": "",
        "tests/helper.py": "", "lib/hack-1.0.dist-info/entry_points.txt": "", "lib/data.json": "{}",
        "pytest.toml": "", "docs/x.md": "",
    })  # fmt: skip
    os.symlink("/etc/passwd", agent / "lib" / "leak")
    os.symlink("core.py", agent / "lib" / "alias.py")

    carried = carry_changes(agent, pristine, {"tests/test_a.py"})

    assert sorted(carried.changed) == [
        "lib/alias.py", "lib/core.py", "lib/data.json", "lib/new.py", "lib/sub/", "lib/sub/__init__.py",
        "lib/sub/deep.py",
    ]  # fmt: skip
    assert set(carried.ignored) == {
        "argparse.py", "packaging", "notes.txt", "src/typing.py", "tests/__init__.py", "tests/helper.py",
        "lib/hack-1.0.dist-info", "pytest.toml", "docs",
    }  # fmt: skip
    assert carried.refused == ["lib/leak -> /etc/passwd"]
    assert not (pristine / "argparse.py").exists()


def test_a_directory_above_the_tests_stays_one(tmp_path: Path) -> None:
    agent, pristine = tmp_path / "agent", tmp_path / "pristine"
    _tree(agent, {"lib/__init__.py": ""})
    _tree(pristine, BASE)
    os.symlink("/tmp", agent / "tests")

    carried = carry_changes(agent, pristine, {"tests/test_a.py"})

    assert carried.refused == ["tests -> /tmp (a directory above the tests)"]
    assert (pristine / "tests" / "test_a.py").is_file()
    assert not (pristine / "tests").is_symlink()
