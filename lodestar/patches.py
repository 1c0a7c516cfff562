"""The files a unified diff (a git patch) touches, and which of them would leave the repository.

Shared by rollout (a task's `test_patch` is checked when a run is created) and the gateway node's `swe`
verifier (which restores those files before applying the patch). Pure text processing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_DIFF_GIT = re.compile(r'^diff --git ("?a/.+?"?) ("?b/.+"?)$')
_DIFF_FILE = re.compile(r"^(?:---|\+\+\+) (.+?)(?:\t.*)?$")


def unsafe_paths(paths: Iterable[str]) -> list[str]:
    """The paths that are absolute or climb out of the repository (`..`): a test patch must not name them."""
    return [path for path in paths if path.startswith("/") or ".." in path.split("/")]


def patch_files(patch: str) -> list[str]:
    """Paths (relative to the repository) that a unified diff touches, old and new names, in order."""
    found: list[str] = []
    for line in patch.splitlines():
        git_header = _DIFF_GIT.match(line)
        if git_header:
            found.extend(_strip_prefix(name) for name in git_header.groups())
            continue
        file_header = _DIFF_FILE.match(line)
        if file_header and file_header.group(1) != "/dev/null":
            found.append(_strip_prefix(file_header.group(1)))
    return [path for path in dict.fromkeys(found) if path]


def _strip_prefix(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        raw = name[1:-1].encode("utf-8", "backslashreplace").decode("unicode_escape")  # C-style, octal bytes
        name = raw.encode("latin-1", "replace").decode("utf-8", "replace")
    return name[2:] if name[:2] in ("a/", "b/") else name
