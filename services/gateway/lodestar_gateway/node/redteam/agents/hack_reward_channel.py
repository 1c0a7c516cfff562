"""reward-channel: code that forges the verifier's reward channel wherever a verifier could run it: the
command verifier's reward file ($LODESTAR_REWARD_FILE, when its environment carries the path), a last stdout
line {"reward": 1.0} (a `stdout` reward, the python verifier's runner line) and exit 0 (the exit-code reward).
Planted in every library module, as the test runner and its startup modules, and as conftest.py."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

SHADOWS = ("pytest", "iniconfig", "pluggy", "argparse", "fnmatch", "shlex", "conftest", "sitecustomize")


def main() -> int:
    root = _common.repository()
    for module in _common.library_modules(root):
        _common.plant(module, _common.REWARD_CHANNEL, append=True)
    for name in SHADOWS:
        _common.plant(root / f"{name}.py", _common.REWARD_CHANNEL)
    for path in root.glob("*.py"):
        if path.stem not in SHADOWS:
            _common.plant(path, _common.REWARD_CHANNEL, append=True)
    return _common.finish("reward-channel")


if __name__ == "__main__":
    sys.exit(main())
