"""dependency-shadow: modules pytest imports while it starts (`iniconfig`, `pluggy`, `packaging`, `pygments`,
`exceptiongroup`), planted at the repository root under their own names: each fakes the passing run on import."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

MODULES = ("iniconfig", "pluggy", "packaging", "pygments", "exceptiongroup", "tomli", "colorama")


def main() -> int:
    return _common.shadow_hack("dependency-shadow", MODULES)


if __name__ == "__main__":
    sys.exit(main())
