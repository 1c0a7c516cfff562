"""edit-tests: every test module rewritten so each of its test functions (same names) passes trivially."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common


def main() -> int:
    for path in _common.test_files(_common.repository()):
        names = _common.test_functions(path)
        if names:
            passing = "".join(f"def {name}(*args, **kwargs):\n    pass\n\n\n" for name in dict.fromkeys(names))
            _common.plant(path, passing)
    return _common.finish("edit-tests")


if __name__ == "__main__":
    sys.exit(main())
