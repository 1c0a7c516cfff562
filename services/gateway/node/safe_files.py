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


def make_private_dir(root: Path, relative_parent: str | PurePosixPath, prefix: str) -> Path:
    """A new directory (mode 0700, a random name starting with `prefix`) in `root/relative_parent`."""
    name = f"{prefix}{secrets.token_hex(8)}"
    with directory_fd(root, relative_parent) as parent:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except OSError as error:
            raise SessionFileError(
                f"cannot create a directory in {root}/{relative_parent}: {error.strerror}"
            ) from error
    return root / relative_parent / name


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
