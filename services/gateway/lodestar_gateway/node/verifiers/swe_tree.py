"""The agent's changes, carried onto a pristine checkout: what the `swe` verifier scores.

`carry_changes(agent, pristine, protected)` makes the working tree `pristine` (a fresh checkout of the
base commit made by the node, the test patch already applied) equal to the agent's working tree `agent`,
file by file, carrying only changes to code — an allow-list derived from where the base commit's code
lives:

- edits and deletions of files that exist at the base commit, and new files below an existing directory,
  except that a new module (`*.py`, `*.so`, ...) is carried only inside a package of the base commit (a
  directory that had an `__init__.py`, not the repository root): no new top-level entry of any kind (a
  module or package that would shadow the standard library or a test dependency, a `*.dist-info`), no new
  module in a directory on `sys.path` that is not a package (`src/`, `tests/`);
- never `.git` (the agent's repository metadata: its config, hooks, filters, replace refs and index are
  never read, let alone run);
- never `protected` paths (the files the hidden test patch touches and the test files the test ids name:
  they stay as the base commit and the patch made them) nor a directory above one (it stays a directory);
- never test infrastructure (`is_test_infrastructure`): files that decide how tests run rather than what
  the code does — `conftest.py`, `pytest.py` and `pytest`/`_pytest`/`pluggy` packages, pytest's config
  files (`pytest.toml`, `pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`), `sitecustomize.py`,
  `usercustomize.py`, `*.pth`, package metadata (`*.dist-info`, `*.egg-info`: entry points),
  `.gitattributes`, and compiled bytecode (`__pycache__`, `*.pyc`: an unchecked-hash .pyc runs instead of
  its source). They stay as the base commit has them, whatever the agent did, so a fix that needs them
  changed cannot be scored (documented in docs/swe.md).

What is not carried is listed in `Carried.ignored`. A link the node refuses — one whose target is absolute
or leaves the repository, or a link or file where a directory above a protected path must be — is listed in
`Carried.refused` (the verifier scores 0: the agent made it so).

The agent's tree is only read, never followed: entries are taken with lstat, files opened with O_NOFOLLOW
and copied only when regular, accepted symbolic links recreated as links, anything else (FIFOs, sockets,
devices) ignored. A directory in `pristine` is made a real directory before anything is written below it,
so no write follows a link. Limits: `MAX_FILES` entries and `MAX_BYTES` copied; past them
`TreeTooLargeError` (the verifier scores 0: the agent made it so).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping
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
        "pytest.toml",
        ".pytest.toml",
        ".gitattributes",
        "__pycache__",
    }
)
INFRASTRUCTURE_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "py.py"})
INFRASTRUCTURE_SUFFIXES = (".pth", ".pyc", ".pyo", ".dist-info", ".egg-info", ".egg-link")
MODULE_SUFFIXES = (".py", ".pyw", ".so", ".pyd")


class TreeTooLargeError(Exception):
    """The agent's tree has more files or bytes than the verifier copies."""


def is_test_infrastructure(relative: str) -> bool:
    """Whether a path (relative to the repository) is test infrastructure (module docstring)."""
    parts = PurePosixPath(relative).parts
    if not parts:
        return False
    if parts[0] in INFRASTRUCTURE_PACKAGES:
        return True
    return any(part in INFRASTRUCTURE_NAMES or part.endswith(INFRASTRUCTURE_SUFFIXES) for part in parts)


@dataclass
class Carried:
    """What `carry_changes` did (paths relative to the repository)."""

    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """What the agent changed or added and the allow-list does not carry: left as the base commit has them."""
    refused: list[str] = field(default_factory=list)
    """Links (and non-directories above protected paths) the node refuses: `path -> target`."""
    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class _Base:
    """What the pristine tree held before anything was carried, and what must stay."""

    paths: frozenset[str]
    protected: frozenset[str]
    above_protected: frozenset[str]
    """Directories above a protected path."""
    before_patch: Mapping[str, bytes | None] = field(default_factory=dict)
    """Protected files as the base commit had them before the test patch (None: absent), to tell whether
    the agent changed them."""

    def kept(self, relative: str) -> bool:
        return relative in self.protected or is_test_infrastructure(relative)

    def allows_new(self, relative: str) -> bool:
        """Whether a path absent at the base commit may be carried (module docstring)."""
        parts = PurePosixPath(relative).parts
        if len(parts) == 1:
            return False
        if not parts[-1].endswith(MODULE_SUFFIXES):
            return True
        for depth in range(len(parts) - 1, 0, -1):
            directory = "/".join(parts[:depth])
            if directory in self.paths:
                return f"{directory}/__init__.py" in self.paths
        return False


def carry_changes(
    agent: Path, pristine: Path, protected: set[str], before_patch: Mapping[str, bytes | None] | None = None
) -> Carried:
    """Make `pristine` the agent's tree (module docstring); returns what changed. `before_patch`: the base
    commit's content of the files the test patch changed (only to list as ignored what the agent changed)."""
    above = {parent.as_posix() for path in protected for parent in PurePosixPath(path).parents if parent.parts}
    base = _Base(frozenset(_walk_paths(pristine)), frozenset(protected), frozenset(above), before_patch or {})
    carried = Carried()
    seen: set[str] = set()
    _carry_dir(agent, pristine, "", base, carried, seen)
    for relative in _walk_paths(pristine):
        target = pristine / relative
        if relative in seen or base.kept(relative) or relative in above or not os.path.lexists(target):
            continue  # kept, or below a directory deleted already
        _remove(target)
        carried.deleted.append(relative)
    return carried


def _link_leaves(relative: str, link: str) -> bool:
    """Whether the link at `relative` points outside the repository (or is absolute)."""
    if os.path.isabs(link):
        return True
    resolved = os.path.normpath(os.path.join(os.path.dirname(relative), link))
    return resolved == ".." or resolved.startswith("../")


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


def _carry_dir(agent: Path, pristine: Path, relative: str, base: _Base, carried: Carried, seen: set[str]) -> None:
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
        is_dir = stat.S_ISDIR(info.st_mode)
        if path in base.above_protected and not is_dir:
            what = os.readlink(entry.path) if stat.S_ISLNK(info.st_mode) else "a file"
            carried.refused.append(f"{path} -> {what} (a directory above the tests)")
            continue
        kept = base.kept(path)
        if kept or (path not in base.paths and not base.allows_new(path)):
            if _changed(entry.path, info, pristine / path, base.before_patch, path):
                carried.ignored.append(path)
            if kept and is_dir and not is_test_infrastructure(path) and (pristine / path).is_dir():
                _carry_dir(agent, pristine, path, base, carried, seen)
            continue
        _carry_entry(agent, pristine, path, entry.path, info, base, carried, seen)


def _carry_entry(
    agent: Path,
    pristine: Path,
    path: str,
    source: str,
    info: os.stat_result,
    base: _Base,
    carried: Carried,
    seen: set[str],
) -> None:
    target = pristine / path
    if stat.S_ISDIR(info.st_mode):
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        if not target.exists():
            target.mkdir()
            carried.changed.append(path + "/")
        _carry_dir(agent, pristine, path, base, carried, seen)
    elif stat.S_ISLNK(info.st_mode):
        link = os.readlink(source)
        if target.is_symlink() and os.readlink(target) == link:
            return
        if _link_leaves(path, link):
            carried.refused.append(f"{path} -> {link}")
            return
        _remove(target)
        os.symlink(link, target)
        carried.changed.append(path)
    elif stat.S_ISREG(info.st_mode):
        if _same(source, info, target):
            return
        carried.bytes += info.st_size
        if carried.bytes > MAX_BYTES:
            raise TreeTooLargeError(f"the repository's changed files hold more than {MAX_BYTES} bytes")
        _remove(target)
        _copy_regular(source, target, info.st_mode & 0o111)
        carried.changed.append(path)


def _changed(source: str, info: os.stat_result, target: Path, before: Mapping[str, bytes | None], path: str) -> bool:
    """Whether the agent's entry differs from the base commit's (before the test patch, where it changed)."""
    if path not in before:
        return not _same(source, info, target)
    content = before[path]
    return content is None or not stat.S_ISREG(info.st_mode) or _read(source) != content


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
