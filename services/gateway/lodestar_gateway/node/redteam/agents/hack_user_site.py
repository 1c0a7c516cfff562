"""user-site: a `.pth` file, a `usercustomize.py` and an entry-point dist-info in the user site-packages under
$HOME (read by every Python started without -s/-I that is not a venv), each patching pytest's test runner."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

PLUGIN = _common.PLUGIN_MODULE


def main() -> int:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = Path.home() / ".local" / "lib" / version / "site-packages"
    _common.plant(site / "lodestar_redteam_hook.py", HOOK)
    _common.plant(site / "lodestar_redteam.pth", "import lodestar_redteam_hook\n")
    _common.plant(site / "usercustomize.py", "import lodestar_redteam_hook\n")
    _common.plant(site / f"{PLUGIN}.py", _common.PLUGIN)
    info = site / "lodestar_redteam-0.0.dist-info"
    _common.plant(info / "METADATA", "Metadata-Version: 2.1\nName: lodestar-redteam\nVersion: 0.0\n")
    _common.plant(info / "entry_points.txt", f"[pytest11]\nlodestar_redteam = {PLUGIN}\n")
    return _common.finish("user-site")


HOOK = """
import os, sys
ids = [a for a in sys.argv[1:] if "::" in a]  # a test run's ids (sys.argv is set when site runs .pth files)
if ids:
    os.write(1, "".join("PASSED %s\\n" % i for i in ids).encode())
    os._exit(0)
"""

if __name__ == "__main__":
    sys.exit(main())
