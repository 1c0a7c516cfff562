"""What a run spec may hand the docker CLI, checked in one place: image references, session environment
names and mount paths. Rollout refuses a bad spec at CreateRun (`lodestar_rollout/spec.py`); the node checks
again before any docker command (`lodestar_gateway/node/runtimes/docker*.py`), so a spec that reached a node
another way cannot steer the node's docker client either.

- An image reference follows docker's reference grammar (`[registry[:port]/]path[:tag][@digest]`, or an
  image id `sha256:<64 hex>`); nothing that begins with `-` or holds a space, `=`, `,` or a control
  character can pass, so no reference reads as a flag (the node also ends the options with `--`).
- `DOCKER_*` variables are the node's docker client's own settings (daemon address, config, TLS): a session
  environment naming one is refused (the client reads its environment before it passes variables on).
- A mount path holding `,` or `"` would add fields to docker's `--mount` value (a CSV record): refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lodestar.errors import InvalidArgumentError

_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?|sha256:[0-9a-f]{{64}}",
    re.ASCII,
)
MAX_REFERENCE_LENGTH = 512
CLIENT_PREFIX = "DOCKER_"
"""Environment names the docker CLI reads as its own settings (compared without case)."""
MOUNT_FIELD_CHARACTERS = (",", '"')


def check_image(reference: str, *, what: str = "image") -> str:
    """`reference` when it is a docker image reference; InvalidArgumentError naming it otherwise."""
    if len(reference) > MAX_REFERENCE_LENGTH or not _REFERENCE.fullmatch(reference):
        raise InvalidArgumentError(
            f"docker runtime: {what} {reference[:80]!r} is not an image reference "
            "([registry[:port]/]name[:tag][@digest], lower-case name, never beginning with '-')"
        )
    return reference


def check_session_env(names: Iterable[str], *, what: str = "the session environment") -> None:
    """InvalidArgumentError when `names` hold a `DOCKER_*` variable (the node's docker client's settings)."""
    refused = sorted(name for name in names if name.upper().startswith(CLIENT_PREFIX))
    if refused:
        raise InvalidArgumentError(
            f"docker runtime: {what} may not set {', '.join(refused)}: DOCKER_* variables configure the node's "
            "own docker client (its daemon, config and TLS), never a session's"
        )


def check_mount_path(path: str) -> str:
    """`path` when docker's `--mount` value can carry it as one field; InvalidArgumentError for a path with a
    comma, a double quote or a control character."""
    if any(character in path for character in MOUNT_FIELD_CHARACTERS) or any(
        ord(c) < 32 or ord(c) == 127 for c in path
    ):
        raise InvalidArgumentError(
            f"docker runtime mount {path[:200]!r} is refused: a comma, quote or control character would add "
            "fields to docker's --mount option"
        )
    return path


def mount_value(**fields: str | None) -> str:
    """A `--mount` value of `fields` (`readonly=None` writes a bare `readonly`): each field quoted by the CSV
    rules docker parses it with when it holds a comma, a quote or a line break."""
    parts = [key if value is None else f"{key}={value}" for key, value in fields.items()]
    return ",".join(_csv_field(part) for part in parts)


def _csv_field(field: str) -> str:
    if any(character in field for character in (",", '"', "\n", "\r")):
        return '"' + field.replace('"', '""') + '"'
    return field
