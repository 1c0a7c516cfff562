"""`lodestar images build-task DIR`: a task set's container image for the `docker` runtime, built offline.

DIR holds a `Dockerfile` that starts with `ARG BASE` / `FROM ${BASE}` and may hold a `requirements.txt`.
The build context is a copy of DIR plus `wheels/`: the wheelhouse of `requirements.txt`, made on this
machine with `pip wheel` (so the image installs with `pip install --no-index --find-links`, no index
reachable from the build; an empty `wheels/` without requirements). The image is built with the local
Docker daemon (`DOCKER_BUILDKIT=0`, `--pull=false`: nothing comes from a registry) FROM `--base` (default
`lodestar/session-base:dev`, built by `make session-image`; a clear error when it is missing) and tagged
`--tag` (default `lodestar/task-<DIR name>:dev`), which is printed. The wheelhouse needs the same Python
minor version and platform as the base image's for non-pure wheels (both are Debian 12's 3.11 here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lodestar.errors import FailedPreconditionError, InvalidArgumentError

DEFAULT_BASE = "lodestar/session-base:dev"
BUILD_TIMEOUT_S = 1800


def default_tag(directory: Path) -> str:
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in directory.resolve().name.lower()).strip("-.")
    return f"lodestar/task-{name or 'set'}:dev"


def build_argv(dockerfile: Path, context: Path, base: str, tag: str) -> list[str]:
    return [
        "docker",
        "build",
        "--quiet",
        "--pull=false",
        "-f",
        str(dockerfile),
        "--build-arg",
        f"BASE={base}",
        "-t",
        tag,
        str(context),
    ]


def _run(argv: list[str], what: str, timeout: float) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, "DOCKER_BUILDKIT": "0"}
        )
    except FileNotFoundError as error:
        raise FailedPreconditionError(f"{what}: {argv[0]} is not installed") from error
    except subprocess.TimeoutExpired as error:
        raise FailedPreconditionError(f"{what} timed out after {timeout:g} s") from error
    if done.returncode != 0:
        raise FailedPreconditionError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _require_base(base: str) -> None:
    try:
        _run(["docker", "image", "inspect", "--format", "{{.Id}}", base], f"docker image inspect {base}", 60)
    except FailedPreconditionError as error:
        raise FailedPreconditionError(
            f"base image {base} is not on this Docker daemon: build it with `make session-image` "
            f"(scripts/session-image.sh) or pass --base ({error.message.splitlines()[0]})"
        ) from error


def build_task_image(directory: Path, *, base: str, tag: str, log: bool = True) -> str:
    """Build the task image of `directory` (see the module docstring); returns its tag."""
    dockerfile = directory / "Dockerfile"
    if not dockerfile.is_file():
        raise InvalidArgumentError(f"{directory} has no Dockerfile (a task image starts FROM ${{BASE}})")
    _require_base(base)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lodestar-task-image-") as scratch:
        context = Path(scratch) / "context"
        shutil.copytree(directory, context, ignore=shutil.ignore_patterns(".git", "__pycache__", "wheels"))
        wheels = context / "wheels"
        wheels.mkdir()
        requirements = directory / "requirements.txt"
        if requirements.is_file():
            pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "-r", str(requirements), "-w", str(wheels)]
            _run(pip, "building the wheelhouse (pip wheel)", 900)
        if log:
            print(f"building {tag} FROM {base} ({len(list(wheels.iterdir()))} wheels)", file=sys.stderr)
        _run(build_argv(dockerfile, context, base, tag), f"docker build of {tag}", BUILD_TIMEOUT_S)
    if log:
        print(f"built {tag} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return tag


def _build_task(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        raise InvalidArgumentError(f"{directory} is not a directory")
    print(build_task_image(directory, base=args.base, tag=args.tag or default_tag(directory)))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `images` command group."""
    group = subparsers.add_parser("images", help="container images of task sets (docker runtime)")
    commands = group.add_subparsers(dest="images_command", required=True, metavar="COMMAND")
    build = commands.add_parser("build-task", help="build a task set's image FROM the session base, offline")
    build.add_argument(
        "directory", type=Path, metavar="DIR", help="task set with a Dockerfile (e.g. examples/swe-mini)"
    )
    build.add_argument("--base", default=DEFAULT_BASE, help=f"base image (default {DEFAULT_BASE})")
    build.add_argument("--tag", default="", help="image tag (default lodestar/task-<DIR name>:dev)")
    build.set_defaults(handler=_build_task)
