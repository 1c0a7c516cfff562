"""`python` verifier: `module:function(workspace: Path, task: dict, final_answer: str) -> float`.

Config: {"function": "module:function", "timeout_s": N (default 300), "pythonpath": [dirs]}. The function
runs in a child process (the node's interpreter, `python_runner.py`) inside the session's runtime, so it
sees the same fixed paths as the harness and a hang or crash can be killed and reported: `workspace` is
the workspace path, `task` the task as a dict (task_id, prompt, files, metadata), `final_answer` the text
of the last assistant completion. The module is imported with PYTHONPATH = config.pythonpath (relative
entries against the node's working directory) and the lodestar root, and nothing else: the interpreter runs
isolated (`python -I`: no PYTHON* variables, no user site, neither the working directory nor the script's
on sys.path), so no module the agent planted in the workspace can shadow the verifier's. Its input goes
into a new private directory of the session's TMPDIR, created without following links. An exception, a
non-number or non-finite return, a timeout or a kill is a VerifierError (infrastructure), not 0; a reward
outside the config's `reward_range` (default [0, 1]) is clamped into it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lodestar.errors import InvalidArgumentError
from services.gateway.node.harnesses.base import REPO_ROOT
from services.gateway.node.safe_files import write_new_file
from services.gateway.node.verifiers.base import (
    Verdict,
    VerifierError,
    VerifierInput,
    process_failure,
    tail,
    timeout_of,
)

RUNNER = Path(__file__).with_name("python_runner.py")
INPUT_FILE = "lodestar-verifier-input.json"


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
        write_new_file(private, INPUT_FILE, json.dumps(document).encode("utf-8"))
        argv = [sys.executable, "-I", "-B", str(RUNNER), self.function, str(visible / INPUT_FILE),
                os.pathsep.join(self.pythonpath)]  # fmt: skip
        env: dict[str, str] = {}
        result = await given.run(argv, env, self.timeout_s)
        failure = process_failure(result, self.kind, self.timeout_s)
        if failure is not None:
            raise failure
        details: dict[str, Any] = {
            "kind": self.kind,
            "function": self.function,
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
            "duration_s": round(result.duration_s, 3),
        }
        if result.returncode != 0:
            raise VerifierError(f"python verifier {self.function} failed: {tail(result.stderr)[-1500:]}")
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        try:
            reward = float(json.loads(lines[-1])["reward"])
        except (IndexError, ValueError, KeyError, TypeError) as error:
            raise VerifierError(f"python verifier {self.function} printed no reward ({error})") from error
        return Verdict(reward, details)
