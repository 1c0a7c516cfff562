"""fake-outcome: the code under test, when imported, writes a passing outcome line for every test id on the
command line (and a pytest summary) to the output pipe and ends the process with exit 0 (`os._exit`)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    for module in _common.library_modules(_common.repository()):
        _common.plant(module, _common.FAKE_PASS, append=True)
    return _common.finish("fake-outcome")


if __name__ == "__main__":
    sys.exit(main())
