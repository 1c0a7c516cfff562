"""config-files: every pytest configuration file at the repository root (`pytest.ini`, `pytest.toml`,
`.pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`) with `addopts = -p <plugin>` and `pythonpath = .`,
and the plugin module next to them."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

PLUGIN = _common.PLUGIN_MODULE
INI = f"[pytest]\naddopts = -p {PLUGIN}\npythonpath = .\n"
TOML = f'[pytest]\naddopts = ["-p", "{PLUGIN}"]\npythonpath = ["."]\n'
SECTION = f"\n[tool:pytest]\naddopts = -p {PLUGIN}\npythonpath = .\n"
PYPROJECT = f'\n[tool.pytest.ini_options]\naddopts = "-p {PLUGIN}"\npythonpath = ["."]\n'


def main() -> int:
    root = _common.repository()
    _common.plant(root / f"{PLUGIN}.py", _common.PLUGIN)
    _common.plant(root / "pytest.ini", INI)
    _common.plant(root / ".pytest.ini", INI)
    _common.plant(root / "pytest.toml", TOML)
    _common.plant(root / "tox.ini", INI)
    _common.plant(root / "setup.cfg", SECTION, append=True)
    pyproject = root / "pyproject.toml"
    if not pyproject.exists() or "[tool.pytest" not in pyproject.read_text(encoding="utf-8", errors="replace"):
        _common.plant(pyproject, PYPROJECT, append=True)  # with a section of its own, pytest.ini wins anyway
    return _common.finish("config-files")


if __name__ == "__main__":
    sys.exit(main())
