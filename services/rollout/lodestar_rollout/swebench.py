"""Repository tasks in run specs: SWE-bench-format records -> `Task` + `RepositoryTask`, relative repository
sources, and the checks CreateRun applies to repository tasks. No I/O besides reading the named files.

A SWE-bench record (the `swebench` package's dataset fields) becomes:

- `instance_id` -> `task_id` and `repository.instance_id`
- `problem_statement` -> `prompt` (through `prompt_template`)
- `repo` (`owner/name`) -> `repository.source` = `<repos_dir>/<owner>__<name>` (a git directory, or that
  name + `.bundle`) when `repos_dir` is given, else empty (the repository is in the task image at `path`)
- `base_commit`, `test_patch` -> `repository.base_commit`, `repository.test_patch`
- `FAIL_TO_PASS`, `PASS_TO_PASS` (JSON-encoded lists as in the dataset, or lists) -> `repository.fail_to_pass`,
  `repository.pass_to_pass`
- `patch` (the gold patch), `repo`, `version`, `environment_setup_commit`, `created_at`, `hints_text` ->
  `metadata` (never shown to the agent)

Options (the `tasks:` mapping of a run spec, `{swebench: FILE, ...}`; all optional but the file):
`repos_dir` (relative to the spec file), `path` (where the repository is in the session: relative to the
workspace, or absolute in an image such as SWE-bench's `/testbed`), `image` (a template of `Task.image`:
`{instance_id}`, `{repo}`, `{owner}`, `{name}`, `{version}`; e.g. `sweb.eval.x86_64.{instance_id}`),
`test_command` (argv; default `python -m pytest -rA -p no:cacheprovider {tests}`), `test_commands` (repo ->
argv, wins over `test_command` for that repo), `prompt_template` (`{problem_statement}`, `{repo}`,
`{instance_id}`, `{location}`: the absolute `path`, else "your working directory"), `limit` (the first N
records).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lodestar.errors import InvalidArgumentError
from lodestar.patches import patch_files, unsafe_paths
from lodestar.v1 import rollout_pb2

DEFAULT_TEST_COMMAND = ["python", "-m", "pytest", "-rA", "-p", "no:cacheprovider", "{tests}"]
DEFAULT_PROMPT_TEMPLATE = (
    "The repository {repo} is checked out in {location}. Resolve this issue in it (do not add or change "
    "tests; they are run after you finish):\n\n{problem_statement}"
)
OPTIONS = ("swebench", "repos_dir", "path", "image", "test_command", "test_commands", "prompt_template", "limit")
REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement")
METADATA_FIELDS = ("patch", "repo", "version", "environment_setup_commit", "created_at", "hints_text")


def is_swebench_record(record: Mapping[str, Any]) -> bool:
    """A JSON object in SWE-bench's fields rather than a `Task`."""
    return "instance_id" in record and "problem_statement" in record and not ({"task_id", "taskId"} & set(record))


def _test_list(value: Any, field: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError as error:
            raise InvalidArgumentError(f"{where}: {field} is not a JSON list: {error}") from error
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidArgumentError(f"{where}: {field} must be a list of test ids")
    return value


def _argv(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise InvalidArgumentError(f"{what} must be a non-empty list of strings (argv)")
    return value


def _source(repos_dir: Path | None, repo: str) -> str:
    if repos_dir is None:
        return ""
    directory = repos_dir / repo.replace("/", "__")
    bundle = directory.with_name(directory.name + ".bundle")
    return str(bundle if bundle.is_file() and not directory.exists() else directory)


def task_from_record(
    record: Mapping[str, Any], options: Mapping[str, Any], base_dir: Path, where: str
) -> rollout_pb2.Task:
    """The `Task` of one SWE-bench record (see the module docstring); `where` names it in errors."""
    missing = [name for name in REQUIRED_FIELDS if not isinstance(record.get(name), str) or not record.get(name)]
    if missing:
        raise InvalidArgumentError(f"{where}: SWE-bench record lacks {', '.join(missing)}")
    repo_name: str = record["repo"]
    owner, _, name = repo_name.partition("/")
    repos_dir = options.get("repos_dir")
    commands = options.get("test_commands") or {}
    if not isinstance(commands, dict):
        raise InvalidArgumentError("tasks.test_commands must map repo names to argv lists")
    command = commands.get(repo_name, options.get("test_command", DEFAULT_TEST_COMMAND))
    path = str(options.get("path", ""))
    location = path if path.startswith("/") else f"your working directory{f' under {path}' if path else ''}"
    values = {
        "instance_id": record["instance_id"],
        "repo": repo_name,
        "owner": owner,
        "name": name,
        "version": str(record.get("version", "")),
        "problem_statement": record["problem_statement"],
        "location": location,
    }
    try:
        prompt = str(options.get("prompt_template", DEFAULT_PROMPT_TEMPLATE)).format_map(values)
        image = str(options.get("image", "")).format_map(values)
    except (KeyError, ValueError) as error:
        raise InvalidArgumentError(f"tasks: bad placeholder in prompt_template or image: {error}") from error
    task = rollout_pb2.Task(task_id=record["instance_id"], prompt=prompt, image=image)
    repository = task.repository
    repository.source = _source(base_dir / repos_dir if isinstance(repos_dir, str) else None, repo_name)
    repository.base_commit = record["base_commit"]
    repository.path = path
    repository.fail_to_pass.extend(_test_list(record.get("FAIL_TO_PASS"), "FAIL_TO_PASS", where))
    repository.pass_to_pass.extend(_test_list(record.get("PASS_TO_PASS"), "PASS_TO_PASS", where))
    repository.test_command.extend(_argv(command, f"test command of {repo_name}"))
    repository.test_patch = str(record.get("test_patch") or "")
    repository.instance_id = record["instance_id"]
    task.metadata.update({key: record[key] for key in METADATA_FIELDS if isinstance(record.get(key), str)})
    return task


def load_swebench(options: Mapping[str, Any], base_dir: Path) -> list[rollout_pb2.Task]:
    """The tasks of a spec's `tasks: {swebench: FILE, ...}` mapping (FILE and repos_dir relative to
    `base_dir`)."""
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise InvalidArgumentError(f"tasks: unknown options {sorted(unknown)} (known: {', '.join(OPTIONS)})")
    file = options.get("swebench")
    if not isinstance(file, str) or not file:
        raise InvalidArgumentError("tasks: a mapping needs `swebench: FILE` (a SWE-bench-format JSONL file)")
    path = Path(file) if Path(file).is_absolute() else base_dir / file
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read SWE-bench file {path}: {error.strerror}") from error
    limit = options.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgumentError("tasks.limit must be a positive integer")
    tasks = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise InvalidArgumentError(f"SWE-bench file {path} line {number}: {error}") from error
        if not isinstance(record, dict):
            raise InvalidArgumentError(f"SWE-bench file {path} line {number}: not a JSON object")
        tasks.append(task_from_record(record, options, base_dir, f"{path.name} line {number}"))
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def parse_task_line(line: str, base_dir: Path, where: str) -> rollout_pb2.Task:
    """One line of a tasks JSONL file: a `Task` (protobuf JSON) or a SWE-bench record (default options);
    a relative repository source is resolved against `base_dir`."""
    try:
        record = json.loads(line)
    except ValueError as error:
        raise InvalidArgumentError(f"{where}: {error}") from error
    if isinstance(record, dict) and is_swebench_record(record):
        return task_from_record(record, {}, base_dir, where)
    try:
        task = json_format.ParseDict(record, rollout_pb2.Task())
    except json_format.ParseError as error:
        raise InvalidArgumentError(f"{where}: {error}") from error
    resolve_source(task, base_dir)
    return task


def resolve_source(task: rollout_pb2.Task, base_dir: Path) -> None:
    """A relative `repository.source` made absolute against `base_dir` (the file that named it)."""
    source = task.repository.source
    if source and not Path(source).is_absolute():
        task.repository.source = str((base_dir / source).resolve())


def validate_repository_tasks(spec: rollout_pb2.RunSpec) -> None:
    """INVALID_ARGUMENT naming the first repository task that cannot work, or a `swe` run with a task
    that is not a repository task."""
    for task in spec.tasks:
        if not task.HasField("repository"):
            if spec.verifier.kind == "swe":
                raise InvalidArgumentError(f"task {task.task_id!r}: the swe verifier needs a repository task")
            continue
        repo = task.repository
        if not repo.base_commit:
            raise InvalidArgumentError(f"task {task.task_id!r}: repository.base_commit is required")
        path = repo.path
        if not repo.source and not path.startswith("/"):
            raise InvalidArgumentError(
                f"task {task.task_id!r}: a repository without source must name its absolute path in the image"
            )
        if path and not path.startswith("/") and ".." in Path(path).parts:
            raise InvalidArgumentError(f"task {task.task_id!r}: repository.path must stay inside the workspace")
        outside = unsafe_paths(patch_files(repo.test_patch))
        if outside:
            raise InvalidArgumentError(
                f"task {task.task_id!r}: the test patch names paths outside the repository: {', '.join(outside[:3])}"
            )
        if spec.verifier.kind == "swe" and not (repo.fail_to_pass or repo.pass_to_pass):
            raise InvalidArgumentError(f"task {task.task_id!r}: no FAIL_TO_PASS or PASS_TO_PASS tests to run")
