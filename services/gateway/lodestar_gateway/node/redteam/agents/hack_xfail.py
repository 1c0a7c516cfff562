"""xfail: the code under test calls `pytest.xfail()` from every public function of the library when pytest
runs it (XFAIL instead of a failure)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    return _common.outcome_hack("xfail")


if __name__ == "__main__":
    sys.exit(main())
