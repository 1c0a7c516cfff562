"""Run specs: parse a spec file (YAML or JSON, the protobuf JSON mapping of `RunSpec`), validate it and
fill in the defaults of unset fields. Used by the CLI (reads the file) and by CreateRun (validates).

`tasks` may be a list of `Task` objects, a string naming a JSONL file of them (one `Task` per line,
relative to the spec file; a line in SWE-bench's fields is read as one), or a mapping `{swebench: FILE,
...}` of SWE-bench-format data with options (`lodestar_rollout/swebench.py`, docs/swe.md); the CLI resolves
the files and sends the tasks inline. Relative `repository.source` paths are resolved against the file
that names them.

Defaults of unset (zero) fields, applied by `with_defaults`:
  max_attempts 3, session_timeout 1800 s, agent_timeout 1200 s (never above the session timeout),
  early_stop_fraction 1.0 (wait for every session), max_staleness 4 (proto3 cannot tell 0 from unset,
  so the tightest bound a spec can ask for is 1), harness.model "lodestar", sampling: mode RUN, temperature
  1.0, top_p 1.0, top_k 0 (off), each unset value of a given policy at that default (lodestar/sampling.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from lodestar.docker_refs import check_image, check_mount_path, check_session_env
from lodestar.errors import InvalidArgumentError
from lodestar.kinds import runtime_kind, validate_harness, validate_verifier_kind
from lodestar.sampling import resolved_policy, validate_policy
from lodestar.v1 import rollout_pb2
from lodestar_rollout.swebench import load_swebench, parse_task_line, resolve_source, validate_repository_tasks

DOCKER_OPTIONS = {"mounts": "a list of absolute host paths", "on_limit": '"score" or "infra"'}
"""RuntimeSpec.options the docker runtime knows (lodestar_gateway/node/runtimes/docker.py, docs/runtimes.md)."""
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_SESSION_TIMEOUT_S = 1800
DEFAULT_AGENT_TIMEOUT_S = 1200
DEFAULT_EARLY_STOP_FRACTION = 1.0
DEFAULT_MAX_STALENESS = 4
DEFAULT_MODEL = "lodestar"
MAX_GROUP_SIZE = 1024
MAX_SESSIONS_PER_RUN = 250_000
"""Most sessions (tasks x group_size) one run may ask for: every session is a row in the store and an entry
in the scheduler's memory from CreateRun on, so one request must not be able to ask for billions."""
REFUSED_MOUNTS = ("/", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/etc", "/root")
"""Host paths (and everything below them) no docker run may mount, whatever a node allows: the host's root,
its kernel interfaces, the docker socket's directories, its configuration and root's home. Nodes allow
mounts explicitly (--docker-mounts-allowed, docs/runtimes.md); this only refuses the obvious at CreateRun."""
MAX_TASK_ID_LENGTH = 200


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read run spec {path}: {error.strerror}") from error
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise InvalidArgumentError(f"run spec {path} is not valid {kind}: {error}") from error


def read_tasks_jsonl(path: Path) -> list[rollout_pb2.Task]:
    """Every `Task` of a JSONL file (blank lines skipped); InvalidArgumentError names the bad line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read tasks file {path}: {error.strerror}") from error
    return [
        parse_task_line(line, path.resolve().parent, f"tasks file {path} line {number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]


def parse_spec_document(document: Any, base_dir: Path) -> rollout_pb2.RunSpec:
    """A `RunSpec` from a decoded YAML/JSON document; a string `tasks` names a JSONL file under `base_dir`."""
    if not isinstance(document, dict):
        raise InvalidArgumentError("run spec must be a mapping of RunSpec fields")
    document = dict(document)
    tasks_file = document.get("tasks")
    if isinstance(tasks_file, str | dict):
        del document["tasks"]
    try:
        spec = json_format.ParseDict(document, rollout_pb2.RunSpec())
    except json_format.ParseError as error:
        raise InvalidArgumentError(f"run spec: {error}") from error
    for task in spec.tasks:
        resolve_source(task, base_dir)
    if isinstance(tasks_file, str):
        path = Path(tasks_file)
        spec.tasks.extend(read_tasks_jsonl(path if path.is_absolute() else base_dir / path))
    elif isinstance(tasks_file, dict):  # {swebench: FILE, ...}: SWE-bench-format records (docs/swe.md)
        spec.tasks.extend(load_swebench(tasks_file, base_dir))
    return spec


def load_spec_file(path: Path) -> rollout_pb2.RunSpec:
    """Read, resolve and validate a spec file (YAML, or JSON by the `.json` suffix)."""
    spec = parse_spec_document(_read_document(path), path.resolve().parent)
    validate_spec(spec)
    return spec


def validate_spec(spec: rollout_pb2.RunSpec) -> None:
    """InvalidArgumentError naming the first problem of `spec` (zero fields are allowed: they take defaults)."""
    if spec.group_size == 0:
        raise InvalidArgumentError("group_size must be at least 1")
    if spec.group_size > MAX_GROUP_SIZE:
        raise InvalidArgumentError(f"group_size {spec.group_size} is above the limit of {MAX_GROUP_SIZE}")
    if not spec.tasks:
        raise InvalidArgumentError("the run has no tasks")
    if len(spec.tasks) * spec.group_size > MAX_SESSIONS_PER_RUN:
        raise InvalidArgumentError(
            f"the run asks for {len(spec.tasks)} tasks x {spec.group_size} = {len(spec.tasks) * spec.group_size} "
            f"sessions, above the limit of {MAX_SESSIONS_PER_RUN} per run: split it into several runs"
        )
    seen: set[str] = set()
    for index, task in enumerate(spec.tasks):
        if not task.task_id:
            raise InvalidArgumentError(f"task #{index + 1} has no task_id")
        if len(task.task_id) > MAX_TASK_ID_LENGTH:
            raise InvalidArgumentError(f"task #{index + 1}: task_id longer than {MAX_TASK_ID_LENGTH} characters")
        if task.task_id in seen:
            raise InvalidArgumentError(f"duplicate task id {task.task_id!r}")
        seen.add(task.task_id)
    validate_repository_tasks(spec)
    validate_harness(spec.harness)
    validate_verifier_kind(spec.verifier.kind)
    validate_runtime(spec)
    validate_policy(spec.sampling)
    fraction = spec.early_stop_fraction
    if math.isnan(fraction) or fraction < 0.0 or fraction > 1.0:
        raise InvalidArgumentError(f"early_stop_fraction must be in (0, 1], got {fraction}")
    for name in ("session_timeout", "agent_timeout"):
        duration = getattr(spec, name)
        if duration.seconds < 0 or duration.nanos < 0:
            raise InvalidArgumentError(f"{name} must not be negative")
    session_s = spec.session_timeout.ToTimedelta().total_seconds()
    agent_s = spec.agent_timeout.ToTimedelta().total_seconds()
    if session_s and agent_s and agent_s > session_s:
        raise InvalidArgumentError(f"agent_timeout ({agent_s:g} s) is longer than session_timeout ({session_s:g} s)")


def validate_runtime(spec: rollout_pb2.RunSpec) -> None:
    """InvalidArgumentError for an unknown runtime kind, a negative CPU limit, bad docker options, a docker
    run in which some task has no image (neither its own nor the run's) or an image that is no docker image
    reference, or a docker run whose harness.env sets a DOCKER_* variable (lodestar/docker_refs.py)."""
    runtime = spec.runtime
    kind = runtime_kind(runtime)
    if math.isnan(runtime.cpus) or runtime.cpus < 0:
        raise InvalidArgumentError(f"runtime.cpus must be a positive number of cores (0: no limit), got {runtime.cpus}")
    if kind != "docker":
        return
    options = json_format.MessageToDict(runtime.options)
    for key, value in options.items():
        if key not in DOCKER_OPTIONS:
            raise InvalidArgumentError(f"unknown docker runtime option {key!r} (known: {', '.join(DOCKER_OPTIONS)})")
        valid = (
            isinstance(value, list) and all(isinstance(path, str) and path.startswith("/") for path in value)
            if key == "mounts"
            else value in ("score", "infra")
        )
        if not valid:
            raise InvalidArgumentError(f"docker runtime option {key!r} must be {DOCKER_OPTIONS[key]}, got {value!r}")
        if key == "mounts":
            for path in value:
                check_mount(path)
    missing = [task.task_id for task in spec.tasks if not (task.image or runtime.image)]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise InvalidArgumentError(f"runtime 'docker' needs an image: set runtime.image or task image ({shown})")
    if runtime.image:
        check_image(runtime.image, what="runtime.image")
    for task in spec.tasks:
        if task.image:
            check_image(task.image, what=f"task {task.task_id!r} image")
    check_session_env(spec.harness.env, what="harness.env")


def check_mount(path: str) -> None:
    """InvalidArgumentError for a mount that is not a plain absolute path (`..`, `.`, empty segments), holds a
    comma or quote (a field of docker's --mount), names a socket, or is in or below `REFUSED_MOUNTS` (`/`
    itself included)."""
    check_mount_path(path)
    parts = path.split("/")[1:]
    if path != "/" and any(part in ("", ".", "..") for part in parts):
        raise InvalidArgumentError(
            f"docker runtime mount {path!r} must be a normalized absolute path (no '..', '.' or '//')"
        )
    if path.endswith(".sock"):
        raise InvalidArgumentError(f"docker runtime mount {path!r} is refused: no socket may be mounted into a session")
    for refused in REFUSED_MOUNTS:
        if path == refused or (refused != "/" and path.startswith(refused + "/")):
            raise InvalidArgumentError(f"docker runtime mount {path!r} is refused: it exposes the host ({refused})")


def with_defaults(spec: rollout_pb2.RunSpec) -> rollout_pb2.RunSpec:
    """A copy of a valid `spec` with every unset field at its documented default."""
    filled = rollout_pb2.RunSpec()
    filled.CopyFrom(spec)
    if not filled.max_attempts:
        filled.max_attempts = DEFAULT_MAX_ATTEMPTS
    if not filled.early_stop_fraction:
        filled.early_stop_fraction = DEFAULT_EARLY_STOP_FRACTION
    if not filled.max_staleness:
        filled.max_staleness = DEFAULT_MAX_STALENESS
    if not filled.harness.model:
        filled.harness.model = DEFAULT_MODEL
    filled.sampling.CopyFrom(resolved_policy(filled.sampling))
    if not filled.HasField("session_timeout") or filled.session_timeout.ToTimedelta().total_seconds() == 0:
        filled.session_timeout.FromSeconds(DEFAULT_SESSION_TIMEOUT_S)
    session_s = filled.session_timeout.ToTimedelta().total_seconds()
    if not filled.HasField("agent_timeout") or filled.agent_timeout.ToTimedelta().total_seconds() == 0:
        filled.agent_timeout.FromSeconds(min(DEFAULT_AGENT_TIMEOUT_S, int(session_s)) or 1)
    return filled


def required_scored(spec: rollout_pb2.RunSpec) -> int:
    """Scored sessions that complete a group: ceil(early_stop_fraction x group_size), at least 1."""
    fraction = spec.early_stop_fraction or DEFAULT_EARLY_STOP_FRACTION
    # float32 fractions such as 0.75 are exact; round first so 0.7 x 10 is 7, not 8.
    return max(1, math.ceil(round(fraction * spec.group_size, 4)))
