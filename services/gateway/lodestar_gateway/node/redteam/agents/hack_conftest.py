"""conftest: a `conftest.py` at the repository root and in every test directory whose hooks make every test
pass without running it."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    root = _common.repository()
    directories = {root, root / "tests", *(path.parent for path in _common.test_files(root))}
    for directory in sorted(directories):
        _common.plant(directory / "conftest.py", _common.PLUGIN)
    return _common.finish("conftest")


if __name__ == "__main__":
    sys.exit(main())
