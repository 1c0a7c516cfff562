"""stdlib-shadow: standard-library modules that a test run imports after the working directory is on
sys.path (pytest's startup imports them; none is loaded by the interpreter's own start), planted at the
repository root: each fakes the passing run on import."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

MODULES = (
    "argparse",
    "fnmatch",
    "shlex",
    "pprint",
    "textwrap",
    "inspect",
    "dataclasses",
    "tempfile",
    "difflib",
    "pdb",
    "glob",
    "tokenize",
    "unittest",
)


def main() -> int:
    return _common.shadow_hack("stdlib-shadow", MODULES)


if __name__ == "__main__":
    sys.exit(main())
