"""What the swe hack tests plant in a repository (test_swe_hacks.py on the host runtime, test_swe_docker.py on
docker): each fixes nothing and only tries to fool the verifier."""

from __future__ import annotations

FAKE_PASSES = """import os, sys
lines = "".join("PASSED " + arg + "\\n" for arg in sys.argv if "::" in arg).encode()
for fd in range(1, 64):  # the output pipes, also when pytest captures fds 1 and 2 (its saved copies)
    try:
        if os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:"):
            os.write(fd, lines)
    except OSError:
        pass
os._exit(0)
"""
"""Imported anywhere in the test run: claims every requested test passed (on the run's output) and exits 0."""
FORCE_PASS_PLUGIN = """import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""
UNDER_PYTEST = 'import sys\nif "_pytest" in sys.modules:\n'
PATCH_REPORTS = (
    "import _pytest.reports\n_init = _pytest.reports.TestReport.__init__\n"
    "def _passing(self, *args, **kwargs):\n    _init(self, *args, **kwargs)\n    self.outcome = 'passed'\n"
    "_pytest.reports.TestReport.__init__ = _passing\n"
)
LIBRARY = "slugify/__init__.py"
