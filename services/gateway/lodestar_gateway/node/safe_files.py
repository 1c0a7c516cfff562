"""The node's file access below a session's directories, never through a link the session could have planted.

A session's processes can write anything under its private root (HOME, TMPDIR, workspace), including
symbolic links: `tmp -> /etc` or `tmp/lodestar-input.json -> /root/.bashrc`. A node that later writes a
verifier's input by path would write through them, as the node's user (root on a docker node). Here every
path is walked from the session's root, which the node made and the session cannot replace, one component
at a time with O_NOFOLLOW (`openat`), and new files are created with O_EXCL: a link or a planted file at any
step is an error (SessionFileError), never followed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from lodestar.errors import FailedPreconditionError

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SessionFileError(FailedPreconditionError):
    """A path below a session's root is not what the node expects (a link, a file where a directory should be)."""


def _parts(relative: str | PurePosixPath) -> list[str]:
    path = PurePosixPath(relative)
    if path.is_absolute() or any(part in ("", ".", "..") for part in path.parts):
        raise SessionFileError(f"{str(relative)!r} is not a plain relative path")
    return list(path.parts)


def _parent(parts: list[str]) -> PurePosixPath | str:
    """The directory part of a path given as its components ("." for a bare name)."""
    return PurePosixPath(*parts[:-1]) if len(parts) > 1 else "."


@contextlib.contextmanager
def directory_fd(root: Path, relative: str | PurePosixPath = ".") -> Iterator[int]:
    """An fd of the directory `root/relative`, reached without following links below `root`."""
    fd = os.open(root, _DIRECTORY)
    try:
        for part in [] if str(relative) in ("", ".") else _parts(relative):
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError as error:
                raise SessionFileError(f"{root}/{relative}: {part!r} is not a directory ({error.strerror})") from error
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def write_new_file(root: Path, relative: str | PurePosixPath, data: bytes, *, mode: int = 0o644) -> Path:
    """Create `root/relative` (which must not exist) with `data`; its directory is reached without links."""
    parts = _parts(relative)
    with directory_fd(root, _parent(parts)) as parent:
        try:
            fd = os.open(
                parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
            )
        except OSError as error:
            raise SessionFileError(f"cannot create {root}/{relative}: {error.strerror}") from error
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    return root.joinpath(*parts)


def make_private_dir(
    root: Path, relative_parent: str | PurePosixPath, prefix: str, *, owner: tuple[int, int] | None = None
) -> Path:
    """A new directory (mode 0700, a random name starting with `prefix`) in `root/relative_parent`, given to
    `owner` (uid, gid) when set."""
    name = f"{prefix}{secrets.token_hex(8)}"
    with directory_fd(root, relative_parent) as parent:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            if owner is not None:
                os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
        except OSError as error:
            raise SessionFileError(
                f"cannot create a directory in {root}/{relative_parent}: {error.strerror}"
            ) from error
    return root / relative_parent / name


def give_tree(top: Path, owner: tuple[int, int]) -> int:
    """Give `top` and everything below it to `owner` (uid, gid); links are changed themselves, never
    followed. Only for a tree no session process can change meanwhile (before the harness starts, or one
    the node built while none runs). Returns the number of entries changed."""
    if not stat.S_ISDIR(os.lstat(top).st_mode):
        raise SessionFileError(f"{top} is not a directory")
    count = 0
    for directory, dirs, files in os.walk(top, followlinks=False):
        for name in [".", *dirs, *files]:
            os.chown(os.path.join(directory, name), *owner, follow_symlinks=False)
            count += 1
    return count


def read_regular_file(root: Path, relative: str | PurePosixPath, *, limit: int) -> bytes | None:
    """The bytes of the regular file `root/relative` (at most `limit`), None when there is none; a link or
    anything but a regular file at the end or on the way is SessionFileError."""
    parts = _parts(relative)
    with directory_fd(root, _parent(parts)) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise SessionFileError(f"cannot read {root}/{relative}: {error.strerror}") from error
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise SessionFileError(f"{root}/{relative} is not a regular file")
            return handle.read(limit)
