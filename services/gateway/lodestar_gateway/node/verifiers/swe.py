"""`swe` verifier: the tests of a repository task (SWE-bench style), run against what the agent left.

Config (all optional): {"timeout_s": 300 (the test run), "parser": "auto" | "pytest" | "unittest" |
"exit_code" (for test commands that are not pytest runs: `swe_tests.py`), "partial_credit": false,
"env": {extra variables of the test run}}.

The task must have `repository` (docs/swe.md). After the agent ran, what is scored is a tree the agent never
touched, carrying only its changes to the code (when the node holds the repository's `source`, the usual
case), in a scoring directory the node makes for this verification outside the session's directories
(`swe_area.py`, with a fresh HOME and TMPDIR):

1. The node checks `base_commit` out afresh there with its own git (no hooks, no config of the agent's:
   repository.py) and applies the `test_patch` (the agent never saw it; a patch that does not apply to the
   base commit is the dataset's error).
2. It carries the agent's working-tree changes onto it file by file, through an allow-list derived from
   where the base commit's code lives (`swe_tree.py`): never `.git`, the protected files (the patch's and
   those the test ids name), test infrastructure, metadata, or a new top-level module.
3. `test_command` (`{tests}` -> the FAIL_TO_PASS and PASS_TO_PASS ids) runs in that tree, in the session's
   runtime (`VerifierInput.run`). A pytest run (`swe_report.py`) goes through the node's bootstrap
   (`swe_bootstrap.py`: `python -I`, the test framework and standard library imported before the repository
   is on `sys.path`, plugin autoload off, rootdir, config and conftest search pinned to the base commit's, a
   guard against a replaced test runner) and its per-test outcomes come from the bootstrap's report, never
   from its output. Any other command's outcomes are parsed from its output (`parser`: weaker, docs/swe.md).

A repository that lives only in the task's image (no `source`, an absolute `path`) cannot be checked out by
the node: it is scored in place (the test patch's files restored with `git checkout <base> <files>` as
SWE-bench does, then the patch applied), which an agent that rewrites `.git` or plants test infrastructure
can influence; use a `source` for untrusted agents.

Reward 1.0 when every FAIL_TO_PASS test passes and no PASS_TO_PASS test breaks, else 0.0 (`partial_credit`:
the passing fraction of FAIL_TO_PASS when no PASS_TO_PASS broke). `details` has each test's outcome.

What the agent caused scores 0.0 with the reason in `details.error`: a repository destroyed, tests that hang
or die by a signal, a run with no outcome or an incomplete or inconsistent report, a replaced test runner
(`details.tampered`), a link the node refuses, a test patch that applies to the base commit but not to the
agent's tree (in place). Infrastructure (VerifierError; the attempt is retried): no repository, a test
patch that does not apply to the base commit, a test command that cannot start (126/127), pytest that cannot
be imported or refuses its arguments, git missing. Processes see `PYTHONDONTWRITEBYTECODE=1`,
`PYTHONNOUSERSITE=1`, `PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`, git's `safe.directory=*` and the runtime's PATH; on
the `host` runtime the bin directory of the node's Python comes first (`python` is the node's interpreter),
in a container the image's PATH decides. A config `env.PATH` replaces either.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from lodestar.errors import InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.patches import patch_files, unsafe_paths
from lodestar_gateway.node.harnesses.base import SYSTEM_PATH
from lodestar_gateway.node.repository import checkout_base, git, repository_dir
from lodestar_gateway.node.safe_files import SessionFileError, write_new_file
from lodestar_gateway.node.verifiers.base import AgentFailure, Verdict, VerifierError, VerifierInput, tail, timeout_of
from lodestar_gateway.node.verifiers.swe_area import (
    BOOTSTRAP_NAME,
    CONFIG_NAME,
    NONCE_NAME,
    REPORT_NAME,
    ScoringArea,
    scoring_area,
)
from lodestar_gateway.node.verifiers.swe_report import PytestRun, bootstrap_argv, find_config, pytest_run, read_report
from lodestar_gateway.node.verifiers.swe_tests import (
    PARSERS,
    SweReport,
    command_argv,
    exit_code_outcomes,
    parse_outcomes,
    report,
)
from lodestar_gateway.node.verifiers.swe_tree import TreeTooLargeError, carry_changes

_log = get_logger("gateway.node.verifiers.swe")
PATCH_FILE = "lodestar-test.patch"
PREPARE_TIMEOUT_S = 120.0
MAX_REPORT_BYTES = 64 << 20
DEFAULT_TEST_COMMAND = ["python", "-m", "pytest", "-rA", "-p", "no:cacheprovider", "{tests}"]
# Exit codes of PREPARE: the agent's doing (reward 0) ...
_NO_DIRECTORY, _NOT_A_REPOSITORY, _NO_BASE_COMMIT, _RESTORE_FAILED, _AGENT_TREE = 90, 91, 92, 93, 95
_AGENT_CAUSED = {_NO_DIRECTORY, _NOT_A_REPOSITORY, _NO_BASE_COMMIT, _RESTORE_FAILED, _AGENT_TREE}
_PATCH_FAILED = 94  # ... or the dataset's: the test patch does not apply to the base commit
PREPARE = r"""
command -v git >/dev/null || { echo "git is not installed in the session's runtime" >&2; exit 127; }
cd "$1" 2>/dev/null || { echo "repository directory $1 is gone" >&2; exit 90; }
base=$2; patch=$3; shift 3
git rev-parse --git-dir >/dev/null 2>&1 || { echo "$PWD is no longer a git repository" >&2; exit 91; }
git cat-file -e "$base^{commit}" 2>/dev/null || { echo "base commit $base is not in the repository" >&2; exit 92; }
for file in "$@"; do
  if git cat-file -e "$base:$file" 2>/dev/null; then
    git checkout --quiet "$base" -- "$file" || { echo "cannot restore $file" >&2; exit 93; }
  else
    rm -rf -- "$file" || { echo "cannot remove $file" >&2; exit 93; }
  fi
done
[ -s "$patch" ] || exit 0
git apply --whitespace=nowarn "$patch" && exit 0
index="$(git rev-parse --absolute-git-dir)/lodestar-base-index"
GIT_INDEX_FILE=$index git read-tree "$base" && GIT_INDEX_FILE=$index git apply --cached --check "$patch"
applies=$?; rm -f "$index"
if [ $applies = 0 ]; then echo "the test patch applies to the base commit, not to the agent's tree" >&2; exit 95; fi
exit 94
"""
RUN_IN = 'cd "$1" || { echo "cannot enter the scoring directory $1" >&2; exit 126; }; shift; exec "$@"'


def _zero(details: dict[str, Any], error: str) -> NoReturn:
    """What the agent caused: the lowest reward, with why (`details.error` and `agent_failure`)."""
    raise AgentFailure(error, {**details, "resolved": False, "error": error})


def _contents(repo: Path, paths: list[str]) -> dict[str, bytes | None]:
    """The node's own checkout's files at `paths` (None: absent or not a regular file)."""
    found: dict[str, bytes | None] = {}
    for path in paths:
        file = repo / path
        found[path] = file.read_bytes() if file.is_file() and not file.is_symlink() else None
    return found


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
        details: dict[str, Any] = {"kind": self.kind, "restored_files": restored, "parser": self.parser}
        agent_tree = repository_dir(repo, given.workspace_host) if given.workspace_host and repo.source else None
        try:
            async with scoring_area(given) as area:
                if agent_tree is not None:
                    scored = await self._pristine(given, area, agent_tree, restored, details)
                else:
                    scored = await self._in_place(given, area, directory, restored, details)
                await asyncio.to_thread(given.hand_over, area.host)
                return await self._run_tests(given, area, scored, details, started)
        except SessionFileError as error:  # a link or file the session planted where the node writes
            _zero(details, f"the node refuses a path the session planted: {error.message}")

    def _env(self, given: VerifierInput, area: ScoringArea) -> dict[str, str]:
        env = {**area.env(), **self.env}
        if given.runtime_kind == "host":  # as for the `command` harness: `python` is the node's interpreter
            env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", **env}
        return env

    async def _pristine(
        self, given: VerifierInput, area: ScoringArea, agent_tree: Path, restored: list[str], details: dict[str, Any]
    ) -> Path:
        """The pristine tree with the test patch and the agent's changes (its path as the verifier's run sees
        it); AgentFailure when the agent left nothing to score."""
        repo = given.task.repository
        if not await asyncio.to_thread(lambda: agent_tree.is_dir() and not agent_tree.is_symlink()):
            _zero(details, "the repository directory is gone")
        await checkout_base(repo, area.host / "repo")
        before_patch = await asyncio.to_thread(_contents, area.host / "repo", restored)
        if repo.test_patch.strip():
            try:
                await git(area.host / "repo", "apply", "--whitespace=nowarn", "-", stdin=repo.test_patch.encode())
            except InvalidArgumentError as error:
                raise VerifierError(f"swe: the test patch does not apply to {given.task.task_id!r}: {error}") from error
        tests = [*repo.fail_to_pass, *repo.pass_to_pass]
        protected = {*restored, *(test.split("::", 1)[0] for test in tests if "::" in test)}
        try:
            carried = await asyncio.to_thread(carry_changes, agent_tree, area.host / "repo", protected, before_patch)
        except TreeTooLargeError as error:
            _zero(details, str(error))
        details.update(
            scored_on="pristine",
            changed_files=carried.changed[:200],
            deleted_files=carried.deleted[:200],
            ignored_files=carried.ignored[:200],
        )
        if carried.refused:
            details["refused_links"] = carried.refused[:200]
            _zero(details, f"the node refuses the agent's link(s): {', '.join(carried.refused[:5])}")
        return area.visible / "repo"

    async def _in_place(
        self, given: VerifierInput, area: ScoringArea, directory: Path, restored: list[str], details: dict[str, Any]
    ) -> Path:
        """Prepare the agent's own repository (an in-image repository: the module docstring)."""
        task, repo = given.task, given.task.repository
        write_new_file(area.host, PATCH_FILE, repo.test_patch.encode("utf-8"))
        argv = [
            "bash",
            "-c",
            PREPARE,
            "swe-prepare",
            str(directory),
            repo.base_commit,
            str(area.visible / PATCH_FILE),
            *restored,
        ]
        prepared = await self._run(given, area, argv, PREPARE_TIMEOUT_S)
        details["scored_on"] = "in_place"
        if prepared.timed_out or prepared.returncode < 0:
            _zero(details, f"preparing the repository did not finish (exit {prepared.returncode})")
        if prepared.returncode in (126, 127):
            raise VerifierError(f"swe: preparing the repository could not run: {tail(prepared.stderr)[-500:]}")
        if prepared.returncode in _AGENT_CAUSED:
            _log.info("repository unusable, by the agent", task_id=task.task_id, error=prepared.stderr.strip())
            _zero(details, tail(prepared.stderr.strip()))
        if prepared.returncode == _PATCH_FAILED:
            why = tail(prepared.stderr)[-800:]
            raise VerifierError(f"swe: the test patch does not apply to {task.task_id!r}: {why}")
        if prepared.returncode != 0:
            raise VerifierError(f"swe: restoring the test files failed: {tail(prepared.stderr)[-800:]}")
        return directory

    async def _run(self, given: VerifierInput, area: ScoringArea, argv: list[str], timeout_s: float) -> Any:
        env = self._env(given, area)
        if area.binds:
            return await given.run(argv, env, timeout_s, binds=area.binds)
        return await given.run(argv, env, timeout_s)

    async def _run_tests(
        self, given: VerifierInput, area: ScoringArea, directory: Path, details: dict[str, Any], started: float
    ) -> Verdict:
        repo = given.task.repository
        f2p, p2p = list(repo.fail_to_pass), list(repo.pass_to_pass)
        tests = list(dict.fromkeys([*f2p, *p2p]))
        command = command_argv(list(repo.test_command) or DEFAULT_TEST_COMMAND, tests)
        as_pytest = pytest_run(command)
        nonce = secrets.token_hex(16)
        if as_pytest is not None:
            command = await self._through_bootstrap(as_pytest, area, directory, tests, nonce, details)
        result = await self._run(
            given, area, ["bash", "-c", RUN_IN, "swe-tests", str(directory), *command], self.timeout_s
        )
        output = f"{result.stdout}\n{result.stderr}"
        details.update(exit_code=result.returncode, output_tail=tail(output), outcomes_from="output")
        if result.returncode in (126, 127):
            why = f"exit {result.returncode}): {tail(output)[-500:]}"
            raise VerifierError(f"swe: the test command could not run ({why}")
        if result.timed_out:
            _zero(details, f"the tests did not finish in {self.timeout_s:g} s")
        if result.returncode < 0:
            _zero(details, f"the test run was killed by signal {-result.returncode}")
        if as_pytest is not None:
            outcomes = await self._from_report(area, nonce, result.returncode, details)
        elif self.parser == "exit_code":
            outcomes = exit_code_outcomes(tests, result.returncode)
        else:
            outcomes = parse_outcomes(output, self.parser)
            if not outcomes:
                _zero(details, f"the test command reported no test outcome (exit {result.returncode})")
        tested = report(outcomes, f2p, p2p)
        details.update(
            resolved=tested.resolved,
            fail_to_pass=tested.fail_to_pass,
            pass_to_pass=tested.pass_to_pass,
            duration_s=round(time.monotonic() - started, 3),
        )
        return Verdict(self._reward(tested), details)

    def _reward(self, tested: SweReport) -> float:
        return tested.reward(partial_credit=self.partial_credit)

    @staticmethod
    async def _through_bootstrap(
        run: PytestRun, area: ScoringArea, directory: Path, tests: list[str], nonce: str, details: dict[str, Any]
    ) -> list[str]:
        """The pytest run's argv through the node's bootstrap, with the base commit's config (a pristine
        tree's; in place, the node's empty one) and its directory as rootdir."""
        config, rootdir = area.visible / CONFIG_NAME, directory
        if details.get("scored_on") == "pristine":
            found = await asyncio.to_thread(find_config, area.host / "repo", tests)
            if found is not None:
                config = directory / found.relative_to(area.host / "repo")
                rootdir = config.parent
        await asyncio.to_thread(write_new_file, area.host, NONCE_NAME, nonce.encode())
        bootstrap, report_path = area.visible / BOOTSTRAP_NAME, area.visible / REPORT_NAME
        return bootstrap_argv(run, bootstrap, report_path, area.visible / NONCE_NAME, directory, config, rootdir)

    async def _from_report(
        self, area: ScoringArea, nonce: str, returncode: int, details: dict[str, Any]
    ) -> dict[str, str]:
        """Per-test outcomes from the bootstrap's report; AgentFailure when it has none to trust."""
        details["outcomes_from"] = "report"
        text = await asyncio.to_thread(area.report_text, MAX_REPORT_BYTES)
        run = read_report(text or "", nonce, returncode)
        if run.infrastructure is not None:
            raise VerifierError(f"swe: {run.infrastructure}: {details['output_tail'][-500:]}")
        if run.error is not None:
            _zero(details, run.error)
        if run.tampered:
            details["tampered"] = run.tampered[:50]
            _zero(details, f"the test runner was replaced while the tests ran: {', '.join(run.tampered[:5])}")
        details["pytest_exit"] = run.pytest_exit
        if not run.outcomes:
            _zero(details, f"the test run reported no test outcome (pytest exit {run.pytest_exit})")
        return run.outcomes
