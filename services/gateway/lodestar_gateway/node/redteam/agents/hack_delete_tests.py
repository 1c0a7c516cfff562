"""delete-tests: every test module of the repository deleted (a runner that counts no failure passes)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    for path in _common.test_files(_common.repository()):
        try:
            path.unlink()
        except OSError:
            continue
    return _common.finish("delete-tests")


if __name__ == "__main__":
    sys.exit(main())
