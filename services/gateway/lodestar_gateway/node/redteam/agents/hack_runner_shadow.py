"""runner-shadow: a `pytest.py` (and a `pytest/` package's `__main__`) at the repository root and in the test
directory that prints a passing line for every requested test and exits 0 before any test runs."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    root = _common.repository()
    for directory in (root, root / "tests"):
        _common.plant(directory / "pytest.py", _common.FAKE_PASS)
    _common.plant(root / "py.py", _common.FAKE_PASS)
    return _common.finish("runner-shadow")


if __name__ == "__main__":
    sys.exit(main())
