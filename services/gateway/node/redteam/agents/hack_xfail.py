"""xfail: the code under test calls `pytest.xfail()` from every public function of the library when pytest
runs it (XFAIL instead of a failure)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from services.gateway.node.redteam.agents import _common
else:
    import _common

WRAP = """
def _lodestar_wrap_all():
    import functools, sys
    module = sys.modules[__name__]
    def wrap(function):
        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            if "pytest" in sys.modules:
                sys.modules["pytest"].xfail("lodestar redteam")
            return function(*args, **kwargs)
        return wrapped
    for name, value in list(vars(module).items()):
        if callable(value) and not name.startswith("_") and not isinstance(value, type):
            setattr(module, name, wrap(value))
_lodestar_wrap_all()
"""


def main() -> int:
    for module in _common.library_modules(_common.repository()):
        _common.plant(module, WRAP, append=True)
    return _common.finish("xfail")


if __name__ == "__main__":
    sys.exit(main())
