"""Where the Python harnesses live: each in its own virtual environment beside the npm harness tree.

`scripts/install-harnesses.sh` (make harnesses) creates `.harnesses/<name>-venv` with the pinned package;
an adapter finds its entry point there (`<venv>/bin/<script>`). The venvs stay OFF the harness's PATH: a
tool command the agent runs must see the task's `python`, not the one that carries the harness.
"""

from __future__ import annotations

from pathlib import Path

from lodestar_gateway.node.harnesses.base import DEFAULT_BIN_DIR


def harness_root(bin_dir: Path | None) -> Path:
    """The harness install folder of a bin directory (`<root>/node_modules/.bin` -> `<root>`)."""
    bins = bin_dir if bin_dir is not None else DEFAULT_BIN_DIR
    return bins.parent.parent if bins.parent.name == "node_modules" else bins


def venv_script(bin_dir: Path | None, venv: str, script: str) -> Path:
    """`<harness root>/<venv>/bin/<script>`."""
    return harness_root(bin_dir) / venv / "bin" / script
