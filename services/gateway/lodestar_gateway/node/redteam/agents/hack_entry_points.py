"""entry-points: a `*.dist-info` with a `pytest11` entry point at the repository root (plugin autoload finds it
on sys.path) and the plugin module it names."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

PLUGIN = _common.PLUGIN_MODULE


def main() -> int:
    root = _common.repository()
    info = root / "lodestar_redteam-0.0.dist-info"
    _common.plant(info / "METADATA", "Metadata-Version: 2.1\nName: lodestar-redteam\nVersion: 0.0\n")
    _common.plant(info / "entry_points.txt", f"[pytest11]\nlodestar_redteam = {PLUGIN}\n")
    _common.plant(info / "RECORD", "")
    _common.plant(root / f"{PLUGIN}.py", _common.PLUGIN)
    return _common.finish("entry-points")


if __name__ == "__main__":
    sys.exit(main())
