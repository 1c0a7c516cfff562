"""`swe` verifier: the tests of a repository task (SWE-bench style), run against what the agent left.

Config (all optional): {"timeout_s": 300 (the test run), "parser": "auto" | "pytest" | "unittest" |
"exit_code" (see `swe_tests.py`), "partial_credit": false, "env": {extra variables of the test run}}.

The task must have `repository` (docs/swe.md). After the agent ran, what is scored is a tree the agent never
touched, carrying only its changes to the code (when the node holds the repository's `source`, the usual
case):

1. The node checks `base_commit` out afresh into a new private directory of the session's TMPDIR, with its
   own git (no hooks, no config of the agent's: repository.py), and carries the agent's working-tree changes
   onto it file by file (`swe_tree.py`): never `.git` (the agent's config, hooks, filters and replace refs
   are never read), never the files the test patch touches, never test infrastructure (`conftest.py`,
   `pytest.py`, `pytest.ini`, `pyproject.toml`, `setup.cfg`, `*.pth`, bytecode, ...), never through a link.
2. The node applies the `test_patch` there with `git apply` (the agent never saw it).
3. `test_command` (`{tests}` -> the FAIL_TO_PASS and PASS_TO_PASS ids) runs in that tree, in the session's
   runtime (the same container or namespaces as the harness, via `VerifierInput.run`); per-test outcomes
   are parsed from its output.

A repository that lives only in the task's image (no `source`, an absolute `path`) cannot be checked out by
the node: it is scored in place as before (in the session's runtime, the test patch's files restored with
`git checkout <base> <files>` as SWE-bench does, then the patch applied), which an agent that rewrites
`.git` or plants test infrastructure can influence; use a `source` for untrusted agents.

Reward 1.0 when every FAIL_TO_PASS test passes and no PASS_TO_PASS test breaks, else 0.0 (`partial_credit`:
the passing fraction of FAIL_TO_PASS when no PASS_TO_PASS broke). `details` has each test's outcome.

Infrastructure, never 0 (VerifierError): the task has no repository, a file could not be restored, the test
patch does not apply to the restored files (a dataset error), the test run timed out, was killed or could not
start (exit 126/127), or its output reports no test at all (e.g. pytest is not installed: with the `exit_code`
parser this check is off), or git is missing. A repository the agent destroyed (the directory, `.git` or the
base commit gone) scores 0.0 with the reason in `details.error`. Processes see `PYTHONDONTWRITEBYTECODE=1`,
git's `safe.directory=*` (the files may belong to another user inside a container) and the runtime's PATH; on
the `host` runtime the bin directory of the node's Python comes first (as for the `command` harness: `python`
is the node's interpreter), in a container the image's PATH decides (its `python`). A config `env.PATH`
replaces either.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.patches import patch_files, unsafe_paths
from services.gateway.node.harnesses.base import SYSTEM_PATH
from services.gateway.node.repository import checkout_base, git, repository_dir
from services.gateway.node.safe_files import write_new_file
from services.gateway.node.verifiers.base import (
    Verdict,
    VerifierError,
    VerifierInput,
    process_failure,
    tail,
    timeout_of,
)
from services.gateway.node.verifiers.swe_tests import (
    PARSERS,
    command_argv,
    exit_code_outcomes,
    parse_outcomes,
    report,
)
from services.gateway.node.verifiers.swe_tree import TreeTooLargeError, carry_changes

_log = get_logger("gateway.node.verifiers.swe")
PATCH_FILE = "lodestar-test.patch"
PREPARE_TIMEOUT_S = 120.0
DEFAULT_TEST_COMMAND = ["python", "-m", "pytest", "-rA", "-p", "no:cacheprovider", "{tests}"]
# Exit codes of PREPARE: the first three mean the agent destroyed the repository (reward 0), the others are
# infrastructure (a dataset whose patch does not apply, a checkout that failed).
_NO_DIRECTORY, _NOT_A_REPOSITORY, _NO_BASE_COMMIT, _RESTORE_FAILED, _PATCH_FAILED = 90, 91, 92, 93, 94
PREPARE = r"""
command -v git >/dev/null || { echo "git is not installed in the session's runtime" >&2; exit 127; }
cd "$1" 2>/dev/null || { echo "repository directory $1 is gone" >&2; exit 90; }
base=$2; patch=$3; shift 3
git rev-parse --git-dir >/dev/null 2>&1 || { echo "$PWD is no longer a git repository" >&2; exit 91; }
git cat-file -e "$base^{commit}" 2>/dev/null || { echo "base commit $base is not in the repository" >&2; exit 92; }
for file in "$@"; do
  if git cat-file -e "$base:$file" 2>/dev/null; then
    git checkout --quiet "$base" -- "$file" || exit 93
  else
    rm -rf -- "$file" || exit 93
  fi
done
if [ -s "$patch" ]; then git apply --whitespace=nowarn "$patch" || exit 94; fi
"""
RUN_IN = 'cd "$1" && shift && exec "$@"'


class SweVerifier:
    kind = "swe"

    def __init__(self, config: dict[str, Any]) -> None:
        self.timeout_s = timeout_of(config, self.kind)
        self.parser = config.get("parser", "auto")
        if self.parser not in PARSERS:
            raise InvalidArgumentError(f"swe verifier: parser must be one of {', '.join(PARSERS)}, got {self.parser!r}")
        partial = config.get("partial_credit", False)
        if not isinstance(partial, bool):
            raise InvalidArgumentError("swe verifier: partial_credit must be true or false")
        self.partial_credit = partial
        env = config.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(value, str) for value in env.values()):
            raise InvalidArgumentError("swe verifier: env must be an object of strings")
        self.env: dict[str, str] = {
            "PYTHONDONTWRITEBYTECODE": "1",
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            **env,
        }

    async def score(self, given: VerifierInput) -> Verdict:
        task = given.task
        if not task.HasField("repository"):
            raise VerifierError(f"swe: task {task.task_id!r} has no repository")
        repo = task.repository
        try:
            directory = repository_dir(repo, given.workspace) or Path(repo.path)
        except InvalidArgumentError as error:
            raise VerifierError(f"swe: {error.message}") from error
        started = time.monotonic()
        restored = patch_files(repo.test_patch)
        if unsafe_paths(restored):
            raise VerifierError(f"swe: the test patch of {task.task_id!r} names paths outside the repository")
        env = self.env
        if given.runtime_kind == "host":  # as for the `command` harness: `python` is the node's interpreter
            env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", **self.env}
        details: dict[str, Any] = {"kind": self.kind, "restored_files": restored, "parser": self.parser}
        agent_tree = repository_dir(repo, given.workspace_host) if given.workspace_host and repo.source else None
        if agent_tree is not None:
            scored = await self._pristine(given, agent_tree, restored, details)
            if isinstance(scored, Verdict):
                return scored
            return await self._run_tests(given, scored, env, details, started)
        return await self._in_place(given, directory, restored, env, details, started)

    async def _pristine(
        self, given: VerifierInput, agent_tree: Path, restored: list[str], details: dict[str, Any]
    ) -> Path | Verdict:
        """The pristine tree with the agent's changes and the test patch (its path as the session sees it),
        or the verdict when the agent left nothing to score."""
        repo = given.task.repository
        if not await asyncio.to_thread(lambda: agent_tree.is_dir() and not agent_tree.is_symlink()):
            return Verdict(0.0, {**details, "resolved": False, "error": "the repository directory is gone"})
        private, visible = given.private_dir(".lodestar-swe-")
        await checkout_base(repo, private / "repo")
        try:
            carried = await asyncio.to_thread(carry_changes, agent_tree, private / "repo", set(restored))
        except TreeTooLargeError as error:
            return Verdict(0.0, {**details, "resolved": False, "error": str(error)})
        details.update(scored_on="pristine", changed_files=carried.changed[:200], deleted_files=carried.deleted[:200],
                       ignored_files=carried.ignored[:200])  # fmt: skip
        if repo.test_patch.strip():
            try:
                await git(private / "repo", "apply", "--whitespace=nowarn", "-", stdin=repo.test_patch.encode())
            except InvalidArgumentError as error:
                raise VerifierError(f"swe: the test patch does not apply to {given.task.task_id!r}: {error}") from error
        await asyncio.to_thread(given.hand_over, private / "repo")
        return visible / "repo"

    async def _in_place(
        self,
        given: VerifierInput,
        directory: Path,
        restored: list[str],
        env: dict[str, str],
        details: dict[str, Any],
        started: float,
    ) -> Verdict:
        """Score in the agent's own repository (an in-image repository: the module docstring)."""
        task, repo = given.task, given.task.repository
        private, visible = given.private_dir(".lodestar-swe-")
        write_new_file(private, PATCH_FILE, repo.test_patch.encode("utf-8"))
        argv = ["bash", "-c", PREPARE, "swe-prepare", str(directory), repo.base_commit,
                str(visible / PATCH_FILE), *restored]  # fmt: skip
        prepared = await given.run(argv, env, PREPARE_TIMEOUT_S)
        failure = process_failure(prepared, self.kind, PREPARE_TIMEOUT_S)
        if failure is not None:
            raise failure
        details["scored_on"] = "in_place"
        if prepared.returncode in (_NO_DIRECTORY, _NOT_A_REPOSITORY, _NO_BASE_COMMIT):
            _log.info("repository destroyed by the agent", task_id=task.task_id, error=prepared.stderr.strip())
            return Verdict(0.0, {**details, "resolved": False, "error": tail(prepared.stderr.strip())})
        if prepared.returncode == _PATCH_FAILED:
            why = tail(prepared.stderr)[-800:]
            raise VerifierError(f"swe: the test patch does not apply to {task.task_id!r}: {why}")
        if prepared.returncode != 0:
            raise VerifierError(f"swe: restoring the test files failed: {tail(prepared.stderr)[-800:]}")
        return await self._run_tests(given, directory, env, details, started)

    async def _run_tests(
        self, given: VerifierInput, directory: Path, env: dict[str, str], details: dict[str, Any], started: float
    ) -> Verdict:
        repo = given.task.repository
        f2p, p2p = list(repo.fail_to_pass), list(repo.pass_to_pass)
        tests = list(dict.fromkeys([*f2p, *p2p]))
        command = command_argv(list(repo.test_command) or DEFAULT_TEST_COMMAND, tests)
        argv = ["bash", "-c", RUN_IN, "swe-tests", str(directory), *command]
        result = await given.run(argv, env, self.timeout_s)
        failure = process_failure(result, self.kind, self.timeout_s)
        if failure is not None:
            raise failure
        output = f"{result.stdout}\n{result.stderr}"
        if self.parser == "exit_code":
            outcomes = exit_code_outcomes(tests, result.returncode)
        else:
            outcomes = parse_outcomes(output, self.parser)
            if not outcomes:
                raise VerifierError(
                    f"swe: the test command reported no test outcome (exit {result.returncode}): {tail(output)[-800:]}"
                )
        tested = report(outcomes, f2p, p2p)
        details.update(
            resolved=tested.resolved,
            fail_to_pass=tested.fail_to_pass,
            pass_to_pass=tested.pass_to_pass,
            exit_code=result.returncode,
            output_tail=tail(output),
            duration_s=round(time.monotonic() - started, 3),
        )
        return Verdict(tested.reward(partial_credit=self.partial_credit), details)
