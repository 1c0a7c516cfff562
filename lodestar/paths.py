"""Paths a caller names, confined to directories the operator configured.

`confined(path, roots, what)` is the one check behind every path a request may carry into a service's file
system: UpdateWeights' `checkpoint_path` (inference `--checkpoint-dirs`), SaveCheckpoint's `path` (the
trainer's checkpoint directory) and a docker run's `options.mounts` (a node's `--docker-mounts`). The path
must be absolute (or, with `relative_to`, is taken under that directory), and once every symlink is
resolved it must be one of the roots or lie below one: a symlink inside a root that points outside does not
let a caller out. Roots are resolved too, so a root given through a symlink still matches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lodestar.errors import InvalidArgumentError, PermissionDeniedError


def confined(
    path: str | Path, roots: Sequence[Path], what: str, *, setting: str, relative_to: Path | None = None
) -> Path:
    """`path` resolved (symlinks followed), when it is one of `roots` or below one of them.

    InvalidArgumentError for an empty path, a NUL byte or a relative path (unless `relative_to` is given,
    which a relative path is taken under); PermissionDeniedError when the resolved path lies outside every
    root (with no roots configured, every path is refused). `what` names the path and `setting` the setting
    that lists the roots in the messages (which never list the roots themselves: they are the server's).
    """
    text = os.fspath(path)
    if not text or "\0" in text:
        raise InvalidArgumentError(f"{what} is empty or not a valid path")
    candidate = Path(text)
    if not candidate.is_absolute():
        if relative_to is None:
            raise InvalidArgumentError(f"{what} must be an absolute path, got {text!r}")
        candidate = relative_to / candidate
    resolved = Path(os.path.realpath(candidate))
    allowed = [Path(os.path.realpath(root)) for root in roots]
    if not allowed:
        raise PermissionDeniedError(f"{what} {text!r} is refused: {setting} lists no directory on this server")
    if not any(resolved == root or resolved.is_relative_to(root) for root in allowed):
        raise PermissionDeniedError(f"{what} {text!r} is outside the directories {setting} allows")
    return resolved
