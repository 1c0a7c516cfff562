"""An arbitrary program as a harness: any client of the vendor APIs (a script, an SDK, another agent).

The contract (docs/nodes.md): the program runs in the session's workspace, stdin=/dev/null, with a clean
environment. The argv is a template: `{prompt}`, `{model}`, `{base_url}`, `{workdir}`, `{python}` (the
node's Python interpreter) and `{repo}` (the lodestar checkout/installation root, e.g. for
`{repo}/examples/agent/agent.py`) are substituted in each argument. On the host runtime the sandbox
shows the program the argv names (an absolute file path, `program_files`), not its directory: a program
that imports modules next to it or reads data files there is an installation (a virtual environment or a
package). The environment carries the gateway
endpoint in every vendor SDK's own variables, the session key as their API key:

    OPENAI_BASE_URL (ends in /v1), OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY,
    GOOGLE_GEMINI_BASE_URL, GEMINI_API_KEY, LODESTAR_SESSION_ID, LODESTAR_TASK_ID,

plus LODESTAR_GATEWAY_URL, LODESTAR_SESSION_KEY, LODESTAR_MODEL, LODESTAR_PROMPT, HOME and TMPDIR. The
bin directory of the node's Python environment comes first on PATH, so `python` is the node's interpreter
(with the `openai` SDK where the node has it).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar_gateway.node.harnesses.base import REPO_ROOT, GatewayEndpoint, Harness, Invocation, RunDirs

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class Command(Harness):
    name = "command"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
        session_id: str = "",
        task_id: str = "",
    ) -> None:
        super().__init__(bin_dir)
        if not argv:
            raise InvalidArgumentError("a command harness needs a non-empty argv")
        self.argv_template = list(argv)
        self.extra_env = dict(env or {})
        self.session_id = session_id
        self.task_id = task_id
        self.binary_name = _substitute(argv[0], _static_values())

    @property
    def binary(self) -> Path:
        program = self.binary_name
        search = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"  # as the harness's own PATH
        found = shutil.which(program, path=search) if "/" not in program else program
        return Path(found) if found else Path(program)

    def require_installed(self) -> Path:
        if shutil.which(str(self.binary)) is None:
            raise FailedPreconditionError(f"command {self.argv_template[0]!r} is not an executable")
        return self.binary

    def is_installed(self) -> bool:
        return shutil.which(str(self.binary)) is not None

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        values = {
            **_static_values(),
            "prompt": prompt,
            "model": endpoint.model,
            "base_url": endpoint.root,
            "workdir": str(dirs.workdir),
        }
        argv = [_substitute(arg, values) for arg in self.argv_template]
        argv[0] = str(self.binary)
        env = self.base_env(
            dirs,
            {
                "LODESTAR_GATEWAY_URL": endpoint.root,
                "LODESTAR_SESSION_KEY": endpoint.session_key,
                "LODESTAR_SESSION_ID": self.session_id,
                "LODESTAR_TASK_ID": self.task_id,
                "LODESTAR_MODEL": endpoint.model,
                "LODESTAR_PROMPT": prompt,
                "OPENAI_BASE_URL": endpoint.root + "/v1",
                "OPENAI_API_KEY": endpoint.session_key,
                "ANTHROPIC_BASE_URL": endpoint.root,
                "ANTHROPIC_API_KEY": endpoint.session_key,
                "GOOGLE_GEMINI_BASE_URL": endpoint.root,
                "GEMINI_API_KEY": endpoint.session_key,
                **self.extra_env,
            },
        )
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        return Invocation(self.name, argv, env, dirs.workdir, reads=self.program_files())

    def program_files(self) -> tuple[Path, ...]:
        """The files the spec's argv names (after `{python}`/`{repo}`, never `{prompt}` or another run value):
        the sandbox shows them to the run, and nothing else of their directory."""
        static = _static_values()
        files = []
        for template in self.argv_template:
            if set(_PLACEHOLDER.findall(template)) - set(static):
                continue
            path = Path(_substitute(template, static))
            if path.is_absolute() and path.is_file():
                files.append(path)
        if self.binary.is_absolute() and self.binary.is_file():
            files.append(self.binary)
        return tuple(dict.fromkeys(files))


def _static_values() -> dict[str, str]:
    return {"python": sys.executable, "repo": str(REPO_ROOT)}


def _substitute(template: str, values: dict[str, str]) -> str:
    """Replace each `{name}` of `values` (other braces are left alone, e.g. JSON in an argument)."""
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)
