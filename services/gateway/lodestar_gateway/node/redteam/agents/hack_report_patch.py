"""report-patch: a `tests/__init__.py` (and one in each test directory) that, imported while pytest collects,
rewrites every test report to `passed` and replaces the test-function runner."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

PATCH = (
    """
def _lodestar_patch_reports():
    import _pytest.reports
    original = _pytest.reports.TestReport.from_item_and_call.__func__
    def passed(cls, item, call):
        report = original(cls, item, call)
        report.outcome = "passed"
        report.longrepr = None
        return report
    _pytest.reports.TestReport.from_item_and_call = classmethod(passed)
try:
    _lodestar_patch_reports()
except Exception:
    pass
"""
    + _common.RUNNER_PATCH
)


def main() -> int:
    root = _common.repository()
    directories = {root / "tests", *(path.parent for path in _common.test_files(root))}
    for directory in sorted(directories):
        if directory.is_dir() and directory != root:
            _common.plant(directory / "__init__.py", PATCH, append=True)
    return _common.finish("report-patch")


if __name__ == "__main__":
    sys.exit(main())
