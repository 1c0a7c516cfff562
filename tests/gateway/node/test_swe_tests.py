"""The `swe` verifier's pure helpers: outcome parsing (pytest -rA and verbose, unittest), the files of a patch,
the test command's argv and the reward rule."""

from __future__ import annotations

import pytest

from lodestar.patches import patch_files, unsafe_paths
from lodestar_gateway.node.verifiers.swe_tests import command_argv, parse_outcomes, report

PYTEST_RA = """\
============================= test session starts ==============================
collected 5 items

tests/test_x.py .F.xE                                                     [100%]
=========================== short test summary info ============================
PASSED tests/test_x.py::test_a
PASSED tests/test_x.py::test_param[a b-1]
FAILED tests/test_x.py::test_b - AssertionError: assert 1 == 2
XFAIL tests/test_x.py::test_c - known bug
ERROR tests/test_x.py::test_a - RuntimeError: teardown broke
SKIPPED [1] tests/test_x.py:40: no network
XPASS tests/test_x.py::test_d - unexpectedly fine
================ 1 failed, 2 passed, 1 xfailed, 1 error in 0.05s ===============
"""
PYTEST_VERBOSE = """\
tests/test_y.py::test_one PASSED                                         [ 50%]
tests/test_y.py::TestK::test_two FAILED                                  [100%]
"""
UNITTEST = """\
test_ok (pkg.tests.TestX.test_ok) ... ok
test_bad (pkg.tests.TestX.test_bad) ... FAIL
test_err (pkg.tests.TestX.test_err) ... ERROR
test_skip (pkg.tests.TestX.test_skip) ... skipped 'slow'
test_known (pkg.tests.TestX.test_known) ... expected failure
"""


def test_pytest_summary_lines():
    assert parse_outcomes(PYTEST_RA, "pytest") == {
        "tests/test_x.py::test_a": "error",  # passed, then errored in teardown: the failure wins
        "tests/test_x.py::test_param[a b-1]": "passed",
        "tests/test_x.py::test_b": "failed",
        "tests/test_x.py::test_c": "xfail",
        "tests/test_x.py::test_d": "xpass",
    }


def test_pytest_verbose_lines():
    assert parse_outcomes(PYTEST_VERBOSE, "auto") == {
        "tests/test_y.py::test_one": "passed",
        "tests/test_y.py::TestK::test_two": "failed",
    }


def test_unittest_lines_and_parser_choice():
    expected = {
        "test_ok (pkg.tests.TestX.test_ok)": "passed",
        "test_bad (pkg.tests.TestX.test_bad)": "failed",
        "test_err (pkg.tests.TestX.test_err)": "error",
        "test_skip (pkg.tests.TestX.test_skip)": "skipped",
        "test_known (pkg.tests.TestX.test_known)": "xfail",
    }
    assert parse_outcomes(UNITTEST, "unittest") == expected
    assert parse_outcomes(UNITTEST, "auto") == expected
    assert parse_outcomes(UNITTEST, "pytest") == {}
    assert parse_outcomes(PYTEST_VERBOSE, "unittest") == {}


def test_report_and_reward():
    outcomes = {"f1": "passed", "f2": "failed", "p1": "passed", "p2": "xfail"}
    partly = report(outcomes, ["f1", "f2"], ["p1", "p2"])
    assert not partly.resolved
    assert (partly.reward(partial_credit=False), partly.reward(partial_credit=True)) == (0.0, 0.5)
    missing = report(outcomes, ["f1"], ["p1", "gone"])
    assert missing.pass_to_pass == {"p1": "passed", "gone": "missing"}
    assert missing.reward(partial_credit=True) == 0.0
    assert report(outcomes, ["f1"], ["p1", "p2"]).reward(partial_credit=False) == 1.0


def test_patch_files():
    patch = (
        "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1 +1 @@\n"
        "diff --git a/tests/new.py b/tests/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/new.py\n"
        "diff --git a/old.py b/renamed.py\nrename from old.py\nrename to renamed.py\n"
        '--- "a/t\\303\\251st.py"\t2020-01-01\n+++ "b/t\\303\\251st.py"\t2020-01-01\n'
    )
    assert patch_files(patch) == ["tests/test_a.py", "tests/new.py", "old.py", "renamed.py", "tést.py"]
    assert patch_files("") == []


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (["pytest", "-rA", "{tests}"], ["pytest", "-rA", "t.py::a", "t.py::b c"]),
        (["bash", "-c", "pytest {tests}"], ["bash", "-c", "pytest t.py::a 't.py::b c'"]),
        (["make", "test"], ["make", "test"]),
    ],
)
def test_test_argv(command: list[str], argv: list[str]):
    assert command_argv(command, ["t.py::a", "t.py::b c"]) == argv


def test_unsafe_paths():
    patch = "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n--- /abs/x\n+++ /abs/x\n--- a/ok/..x\n+++ b/ok/..x\n"
    assert unsafe_paths(patch_files(patch)) == ["../../etc/passwd", "/abs/x"]
