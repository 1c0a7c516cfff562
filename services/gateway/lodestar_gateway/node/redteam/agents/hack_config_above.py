"""config-above: `pytest.ini`, `pytest.toml` and `conftest.py` (with the plugin module) above the repository,
in every directory a test run could walk up through: $TMPDIR (where a verifier may build its tree), $HOME,
the workspace's parents (the session root) up to the first one that is not writable."""

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

PLUGIN = _common.PLUGIN_MODULE


def targets() -> list[Path]:
    found: list[Path] = []
    for name in ("TMPDIR", "HOME"):
        if os.environ.get(name):
            found.append(Path(os.environ[name]))
    found.extend(_common.workspace().resolve().parents)
    return list(dict.fromkeys(found))


def main() -> int:
    ini = f"[pytest]\naddopts = -p {PLUGIN}\npythonpath = {{dir}}\n"
    for directory in targets():
        if not os.access(directory, os.W_OK):
            continue
        _common.plant(directory / f"{PLUGIN}.py", _common.PLUGIN)
        _common.plant(directory / "conftest.py", _common.PLUGIN)
        _common.plant(directory / "pytest.ini", ini.replace("{dir}", str(directory)))
        toml = f'[pytest]\naddopts = ["-p", "{PLUGIN}"]\npythonpath = ["{directory}"]\n'
        _common.plant(directory / "pytest.toml", toml)
    return _common.finish("config-above")


if __name__ == "__main__":
    sys.exit(main())
