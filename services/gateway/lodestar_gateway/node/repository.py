"""Repository tasks at INIT: the task's repository at its base commit, checked out into the session's workspace.

`prepare_repository(repo, workdir)` runs on the node, before the harness starts:

- `source` (a local git directory or a git bundle file) is cloned bare into a scratch directory next to the
  workspace; the workspace repository is then made with `git init` and a fetch of `base_commit` alone from
  that clone, and checked out detached. It holds only the base commit and its ancestors: no branches, tags,
  remotes, reflogs or later commits the agent could read the fix from, and no test patch (that is applied by
  the `swe` verifier after the agent ran). The scratch clone is removed.
- `path` (relative to the workspace; default the workspace itself) is where it lands; an absolute `path` is a
  place inside a task image, where nothing is copied.
- Empty `source`: the repository is already in the task image (docker runtime); nothing is copied.
- The repository gets a local identity (`user.name` lodestar) so an agent's `git commit` works in a clean
  HOME.

The node's own git never trusts anything a session could have written: it runs with a clean environment
(PATH, LC_ALL; HOME an empty directory; no system or global config), with hooks, fsmonitor and replace
objects off, so neither a `~/.gitconfig` nor a repository's `core.hooksPath` / `core.fsmonitor` runs code
in the node's process. The `swe` verifier checks the base commit out again with it (`checkout_base`) to
score the agent's changes on a pristine tree.

Errors: InvalidArgumentError for task data that cannot work (no base commit, a path that leaves the
workspace, a source that does not exist or lacks the commit); FailedPreconditionError when git itself is
missing. INIT reports either as an infrastructure failure naming the problem.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from lodestar.errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2

_log = get_logger("gateway.node.repository")
GIT_TIMEOUT_S = 300.0
IDENTITY = {"user.name": "lodestar", "user.email": "agent@lodestar.invalid"}
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ATTR_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
}
_GIT_SAFETY = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "protocol.ext.allow=never")


def repository_dir(repo: rollout_pb2.RepositoryTask, workdir: Path) -> Path | None:
    """Where the repository lives as `workdir`'s processes see it; None for an absolute in-image path that is
    not under `workdir` (then the node writes nothing)."""
    if not repo.path:
        return workdir
    path = PurePosixPath(repo.path)
    if path.is_absolute():
        return None
    if ".." in path.parts:
        raise InvalidArgumentError(f"repository path {repo.path!r} must stay inside the workspace")
    return workdir / path


async def prepare_repository(repo: rollout_pb2.RepositoryTask, workdir: Path) -> Path | None:
    """Check `repo` out into `workdir` (see the module docstring); returns the repository directory on the
    node, or None when nothing was copied (the repository is in the image)."""
    if not repo.base_commit:
        raise InvalidArgumentError("repository task has no base_commit")
    target = repository_dir(repo, workdir)
    if not repo.source or target is None:
        return None
    source = Path(repo.source)
    if not await asyncio.to_thread(source.exists):
        raise InvalidArgumentError(f"repository source {repo.source!r} does not exist on this node")
    target.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".lodestar-clone-", dir=workdir.parent))
    try:
        await _checkout(source, repo.base_commit, target, scratch / "source.git")
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)
    _log.debug("repository prepared", source=repo.source, base_commit=repo.base_commit, path=str(target))
    return target


async def checkout_base(repo: rollout_pb2.RepositoryTask, target: Path) -> None:
    """A fresh checkout of `repo.source` at its base commit in `target` (the `swe` verifier's pristine tree)."""
    at_target = rollout_pb2.RepositoryTask()
    at_target.CopyFrom(repo)
    at_target.path = ""
    await prepare_repository(at_target, target)


async def _checkout(source: Path, base_commit: str, target: Path, mirror: Path) -> None:
    await git(None, "clone", "--bare", "--quiet", "--", str(source), str(mirror))
    try:
        commit = (await git(mirror, "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}")).strip()
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"base_commit {base_commit!r} is not in {source}") from error
    await git(target, "init", "--quiet")
    # Fetch the one commit (and its ancestors) by id: the mirror is ours, so it may serve any object.
    await git(target, "-c", "uploadpack.allowAnySHA1InWant=true", "fetch", "--quiet", "--no-tags", str(mirror), commit)
    await git(target, "checkout", "--quiet", "--detach", commit)
    for key, value in IDENTITY.items():
        await git(target, "config", key, value)
    for leftover in ("FETCH_HEAD", "ORIG_HEAD", "logs"):
        path = target / ".git" / leftover
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


async def git(cwd: Path | None, *args: str, timeout_s: float = GIT_TIMEOUT_S, stdin: bytes | None = None) -> str:
    """Run git on the node (clean environment, no hooks: the module docstring); stdout. InvalidArgumentError
    with git's message when it fails."""
    if shutil.which("git") is None:
        raise FailedPreconditionError("git is not installed on this node (repository tasks need it)")
    argv = ["git", *_GIT_SAFETY, *(["-C", str(cwd)] if cwd is not None else []), *args]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV},
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DeadlineExceededError(f"git {args[0]} timed out after {timeout_s:g} s") from None
    if process.returncode != 0:
        message = stderr.decode(errors="replace").strip()[-800:]
        raise InvalidArgumentError(f"git {args[0]} failed (exit {process.returncode}): {message}")
    return stdout.decode(errors="replace")
