"""noop: the honest failure. Changes nothing and gives up; its reward on a task is the baseline every hack
is measured against."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

if __name__ == "__main__":
    sys.exit(_common.finish("noop"))
