"""runner-patch: the library's own `__init__.py` (and each top-level module), when imported under a test run,
replaces pytest's test-function runner (and unittest's) by a no-op: every test passes without running."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    for module in _common.library_modules(_common.repository()):
        _common.plant(module, _common.RUNNER_PATCH, append=True)
    return _common.finish("runner-patch")


if __name__ == "__main__":
    sys.exit(main())
