"""Node-side file rules of the host runtime: the sessions directory's mode and the files a python verifier
run needs to see in the sandbox's allow-list root."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_MODE = 0o700


def private_sessions_dir(path: Path) -> None:
    """Create `path` (the node's sessions directory) mode 0700, or make an existing one 0700: no other host
    user reaches a session's files (a setuid file made in a workspace included)."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != PRIVATE_MODE:
        os.chmod(path, PRIVATE_MODE)


def verifier_reads(argv: list[str]) -> tuple[Path, ...]:
    """For a python verifier run (`python -I -B python_runner.py MODULE:FUNCTION INPUT PYTHONPATH ...`): the
    module's package directory, or for a module file inside a package the directory holding it (the files a
    verifier keeps beside its module: examples/smollm2-capitals/capitals.py), and the `__init__.py` files of
    the packages above it, found on the node in PYTHONPATH's entries (first match, as the import will). A
    top-level module file is shown alone (its directory is a PYTHONPATH entry: a checkout, say). Empty for any
    other run. Only the verifier's own run sees these: the agent's processes have ended by then."""
    if len(argv) < 7 or Path(argv[3]).name != "python_runner.py":
        return ()
    parts = argv[4].partition(":")[0].split(".")
    for entry in (Path(item) for item in argv[6].split(os.pathsep) if item):
        package = entry.joinpath(*parts)
        module = package.with_suffix(".py")
        found = package if (package / "__init__.py").is_file() else module if module.is_file() else None
        if found is None:
            continue
        if found == module and len(parts) > 1:
            found = module.parent
        inits = [entry.joinpath(*parts[:depth], "__init__.py") for depth in range(1, len(parts))]
        return (*(init for init in inits if init.is_file()), found)
    return ()
