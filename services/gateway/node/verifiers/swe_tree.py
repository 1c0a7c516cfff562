"""The agent's changes, carried onto a pristine checkout: what the `swe` verifier scores.

`carry_changes(agent, pristine, protected)` makes the working tree `pristine` (a fresh checkout of the
base commit made by the node) equal to the agent's working tree `agent`, file by file, except for:

- `.git` (the agent's repository metadata: its config, hooks, filters, replace refs and index are never
  read, let alone run);
- `protected` paths (the files the hidden test patch touches: they stay at the base commit, then the patch
  is applied);
- test infrastructure (`is_test_infrastructure`): files that decide how tests run rather than what the code
  does — `conftest.py`, `pytest.py` and `pytest`/`_pytest`/`pluggy` packages (they shadow pytest),
  `pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml` (`addopts`), `sitecustomize.py`,
  `usercustomize.py`, `*.pth`, `.gitattributes`, and compiled bytecode (`__pycache__`, `*.pyc`: an
  unchecked-hash .pyc runs instead of its source). They stay as the base commit has them, whatever the
  agent did, so a fix that needs them changed cannot be scored (documented in docs/swe.md).

The agent's tree is only read, never followed: entries are taken with lstat, files opened with O_NOFOLLOW
and copied only when regular, symbolic links recreated as links (they are dereferenced by the test run,
inside the session's sandbox, never by the node), anything else (FIFOs, sockets, devices) ignored. A
directory in `pristine` is made a real directory before anything is written below it, so no write follows a
link. Limits: `MAX_FILES` entries and `MAX_BYTES` copied; past them `TreeTooLargeError` (the verifier
scores 0: the agent made it so).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MAX_FILES = 100_000
MAX_BYTES = 1 << 30
INFRASTRUCTURE_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
        ".gitattributes",
        "__pycache__",
    }
)
INFRASTRUCTURE_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "py.py"})
INFRASTRUCTURE_SUFFIXES = (".pth", ".pyc", ".pyo")


class TreeTooLargeError(Exception):
    """The agent's tree has more files or bytes than the verifier copies."""


def is_test_infrastructure(relative: str) -> bool:
    """Whether a path (relative to the repository) is test infrastructure (module docstring)."""
    parts = PurePosixPath(relative).parts
    if not parts:
        return False
    if parts[0] in INFRASTRUCTURE_PACKAGES:
        return True
    return any(part in INFRASTRUCTURE_NAMES for part in parts) or parts[-1].endswith(INFRASTRUCTURE_SUFFIXES)


@dataclass
class Carried:
    """What `carry_changes` did (paths relative to the repository)."""

    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Test infrastructure and protected files the agent changed or added: left as the base commit has them."""
    files: int = 0
    bytes: int = 0


def carry_changes(agent: Path, pristine: Path, protected: set[str]) -> Carried:
    """Make `pristine` the agent's tree (module docstring); returns what changed."""
    carried = Carried()
    seen: set[str] = set()
    _carry_dir(agent, pristine, "", protected, carried, seen)
    for relative in _walk_paths(pristine):
        target = pristine / relative
        if relative in seen or _kept(relative, protected) or not os.path.lexists(target):
            continue  # kept, or below a directory deleted already
        _remove(target)
        carried.deleted.append(relative)
    return carried


def _kept(relative: str, protected: set[str]) -> bool:
    return relative in protected or is_test_infrastructure(relative)


def _walk_paths(root: Path) -> list[str]:
    """Every path below `root` (not into symlinks or .git), parents before their children."""
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(directory).relative_to(root)
        if base.parts[:1] == (".git",):
            continue
        dirnames[:] = [name for name in dirnames if not (base == Path(".") and name == ".git")]
        found.extend((base / name).as_posix() for name in [*dirnames, *filenames])
    return [path for path in found if path != ".git"]


def _carry_dir(
    agent: Path, pristine: Path, relative: str, protected: set[str], carried: Carried, seen: set[str]
) -> None:
    with os.scandir(agent / relative if relative else agent) as entries:
        listed = sorted(entries, key=lambda entry: entry.name)
    for entry in listed:
        path = f"{relative}/{entry.name}" if relative else entry.name
        if path == ".git":
            continue
        seen.add(path)
        carried.files += 1
        if carried.files > MAX_FILES:
            raise TreeTooLargeError(f"the repository has more than {MAX_FILES} files")
        info = entry.stat(follow_symlinks=False)
        target = pristine / path
        if path in protected or is_test_infrastructure(path):
            if not _same(entry.path, info, target):
                carried.ignored.append(path)
            if stat.S_ISDIR(info.st_mode) and not is_test_infrastructure(path):
                _carry_dir(agent, pristine, path, protected, carried, seen)
            continue
        if stat.S_ISDIR(info.st_mode):
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            if not target.exists():
                target.mkdir()
                carried.changed.append(path + "/")
            _carry_dir(agent, pristine, path, protected, carried, seen)
        elif stat.S_ISLNK(info.st_mode):
            link = os.readlink(entry.path)
            if target.is_symlink() and os.readlink(target) == link:
                continue
            _remove(target)
            os.symlink(link, target)
            carried.changed.append(path)
        elif stat.S_ISREG(info.st_mode):
            if _same(entry.path, info, target):
                continue
            carried.bytes += info.st_size
            if carried.bytes > MAX_BYTES:
                raise TreeTooLargeError(f"the repository's changed files hold more than {MAX_BYTES} bytes")
            _remove(target)
            _copy_regular(entry.path, target, info.st_mode & 0o111)
            carried.changed.append(path)


def _same(source: str, info: os.stat_result, target: Path) -> bool:
    """Whether the agent's entry equals the pristine one (regular files by content and executable bit)."""
    try:
        mine = target.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode) or stat.S_ISLNK(mine.st_mode):
        both = stat.S_ISLNK(info.st_mode) and stat.S_ISLNK(mine.st_mode)
        return both and os.readlink(source) == os.readlink(target)
    if stat.S_ISDIR(info.st_mode) or stat.S_ISDIR(mine.st_mode):
        return stat.S_ISDIR(info.st_mode) and stat.S_ISDIR(mine.st_mode)
    if not (stat.S_ISREG(info.st_mode) and stat.S_ISREG(mine.st_mode)):
        return False
    if info.st_size != mine.st_size or (info.st_mode & 0o111) != (mine.st_mode & 0o111):
        return False
    return _read(source) == target.read_bytes()


def _read(source: str) -> bytes:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return b""
        return handle.read(MAX_BYTES + 1)


def _remove(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.is_symlink() or target.exists():
        target.unlink()


def _copy_regular(source: str, target: Path, executable: int) -> None:
    data = _read(source)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(target, flags, 0o644 | executable)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
