"""`python` verifier: `module:function(workspace: Path, task: dict, final_answer: str) -> float`.

Config: {"function": "module:function", "timeout_s": N (default 300), "pythonpath": [dirs]}. The function
runs in a child process (the node's interpreter, `python_runner.py`) inside the session's runtime, so it
sees the same fixed paths as the harness and a hang or crash can be killed and reported: `workspace` is
the workspace path, `task` the task as a dict (task_id, prompt, files, metadata), `final_answer` the text
of the last assistant completion. The module is imported with PYTHONPATH = config.pythonpath (relative
entries against the node's working directory) and the lodestar root, and nothing else: the interpreter runs
isolated (`python -I`: no PYTHON* variables, no user site, neither the working directory nor the script's
on sys.path), so no module the agent planted in the workspace can shadow the verifier's. Its input goes
into a new private directory of the session's TMPDIR, created without following links.

The result comes back on a channel only the runner holds, never from stdout (which the agent's code can
print to): a file in that private directory that the node opens before the run and reads through its own
descriptor after it; the runner opens it and unlinks it, and the input, before anything else runs, and
makes itself non-dumpable (python_runner.py). Code the function runs in its own process can still write to
the runner's descriptor or change what the function returns (it runs inside the verifier's process); what
that leaves open is in docs/nodes.md.

Failures: an exception whose traceback passes through the agent's files, a process that ended inside the
function without a result (the agent's `os._exit`, a signal) and a hang whose stacks (dumped by the runner
before the timeout) show the agent's code are the agent's (`AgentFailure`: the lowest reward, with the
reason); any other exception, a non-number or non-finite return, a timeout elsewhere, and a runner that
could not start are VerifierErrors (infrastructure). A reward outside `reward_range` is clamped into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lodestar.errors import InvalidArgumentError
from lodestar_gateway.node.harnesses import HarnessResult
from lodestar_gateway.node.harnesses.base import REPO_ROOT
from lodestar_gateway.node.safe_files import SessionFileError, directory_fd, write_new_file
from lodestar_gateway.node.verifiers.base import (
    AgentFailure,
    Verdict,
    VerifierError,
    VerifierInput,
    process_failure,
    tail,
    timeout_of,
)

RUNNER = Path(__file__).with_name("python_runner.py")
INPUT_FILE = "lodestar-verifier-input.json"
RESULT_FILE = "result"
MAX_RESULT_BYTES = 256 * 1024
HANG_MARGIN_S = 2.0
"""The runner dumps its stacks this long before the timeout (a fifth of it for timeouts under 10 s)."""


class PythonVerifier:
    kind = "python"

    def __init__(self, config: dict[str, Any]) -> None:
        function = config.get("function")
        if not isinstance(function, str) or function.count(":") != 1 or not all(function.split(":")):
            raise InvalidArgumentError('python verifier needs config {"function": "module:function"}')
        self.function = function
        self.timeout_s = timeout_of(config, self.kind)
        extra = config.get("pythonpath", [])
        if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
            raise InvalidArgumentError("python verifier: pythonpath must be a list of directories")
        self.pythonpath = [str(Path(item).resolve()) for item in extra] + [str(REPO_ROOT)]

    async def score(self, given: VerifierInput) -> Verdict:
        document = {
            "workspace": str(given.workspace),
            "task": json_format.MessageToDict(given.task, preserving_proto_field_name=True),
            "final_answer": given.final_answer,
        }
        private, visible = given.private_dir(".lodestar-verifier-")
        write_new_file(private, INPUT_FILE, json.dumps(document).encode("utf-8"), mode=0o600)
        if given.owner is not None:
            os.chown(private / INPUT_FILE, *given.owner, follow_symlinks=False)
        # The dump's deadline on the wall clock the sandbox shares: it holds however long the runner took to start.
        dump_at = time.time() + self.timeout_s - min(HANG_MARGIN_S, self.timeout_s / 5)
        session_root = given.workspace.parent
        argv = [
            sys.executable,
            "-I",
            "-B",
            str(RUNNER),
            self.function,
            str(visible / INPUT_FILE),
            os.pathsep.join(self.pythonpath),
            str(visible / RESULT_FILE),
            str(session_root),
            f"{dump_at:.3f}",
        ]  # host_files.verifier_reads reads the first 7
        with _result_channel(private, given.owner) as read_result:
            result = await given.run(argv, {}, self.timeout_s)
            messages, dump = _parse(read_result())
        details: dict[str, Any] = {
            "kind": self.kind,
            "function": self.function,
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
            "duration_s": round(result.duration_s, 3),
        }
        return self._verdict(result, messages, dump, str(session_root), details)

    def _verdict(
        self, result: HarnessResult, messages: list[dict[str, Any]], dump: str, root: str, details: dict[str, Any]
    ) -> Verdict:
        """The verdict the runner's messages give (module docstring: who failed)."""
        last = messages[-1] if messages else {}
        if "reward" in last:
            reward = last["reward"]
            if isinstance(reward, bool) or not isinstance(reward, int | float):
                raise VerifierError(f"python verifier {self.function}: the runner sent {reward!r}, not a number")
            return Verdict(float(reward), details)
        if "error" in last:
            where = f"python verifier {self.function} raised {last['error']}"
            text = str(last.get("traceback", ""))[-1500:]
            if last.get("agent") is True:
                raise AgentFailure(f"{where} in the agent's code", {**details, "traceback": text})
            raise VerifierError(f"{where}: {text}")
        started = bool(messages) and messages[0].get("started") is True
        if not started:
            failure = process_failure(result, self.kind, self.timeout_s)
            raise failure or VerifierError(f"python verifier {self.function} could not start: {tail(result.stderr)}")
        if result.timed_out:
            if f'File "{root}/' not in dump:  # the stacks show no frame of the agent's code
                raise VerifierError(
                    f"python verifier {self.function} timed out after {self.timeout_s:g} s: {dump[-1500:]}"
                )
            message = f"python verifier {self.function} did not finish in {self.timeout_s:g} s: the agent's code hangs"
            raise AgentFailure(message, {**details, "stacks": dump[-3000:]})
        ended = f"exit {result.returncode}" if result.returncode >= 0 else f"signal {-result.returncode}"
        message = f"python verifier {self.function}: its process ended inside the function ({ended}) without a result"
        raise AgentFailure(f"{message}: code it ran ended it", details)


@contextlib.contextmanager
def _result_channel(private: Path, owner: tuple[int, int] | None) -> Iterator[Any]:
    """Create the result file (new, no links followed) and hold it open: yields a reader of what was
    written to it, whatever happens to its name meanwhile."""
    with directory_fd(private) as parent:
        try:
            fd = os.open(
                RESULT_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
            )
        except OSError as error:
            raise SessionFileError(f"cannot create {private}/{RESULT_FILE}: {error.strerror}") from error
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        yield lambda: os.pread(fd, MAX_RESULT_BYTES, 0)
    finally:
        os.close(fd)


def _parse(content: bytes) -> tuple[list[dict[str, Any]], str]:
    """The runner's JSON messages, and the rest (a faulthandler dump of its stacks)."""
    messages: list[dict[str, Any]] = []
    rest: list[str] = []
    for line in content.decode("utf-8", errors="replace").splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            rest.append(line)
            continue
        if isinstance(parsed, dict):
            messages.append(parsed)
    return messages, "\n".join(rest)
