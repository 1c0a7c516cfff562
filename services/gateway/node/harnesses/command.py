"""An arbitrary program as a harness: any client of the vendor APIs (a script, an SDK, another agent).

The argv is a template: `{prompt}`, `{model}`, `{base_url}` and `{workdir}` are substituted in each
argument. The environment carries the gateway endpoint in every vendor SDK's own variables (OpenAI,
Anthropic, Google) and in `LODESTAR_*` variables, so most programs need no config file at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from services.gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs


class Command(Harness):
    name = "command"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        super().__init__(bin_dir)
        if not argv:
            raise InvalidArgumentError("a command harness needs a non-empty argv")
        self.argv_template = list(argv)
        self.extra_env = dict(env or {})
        self.binary_name = argv[0]

    @property
    def binary(self) -> Path:
        program = self.argv_template[0]
        found = shutil.which(program) if "/" not in program else program
        return Path(found) if found else Path(program)

    def require_installed(self) -> Path:
        if shutil.which(str(self.binary)) is None:
            raise FailedPreconditionError(f"command {self.argv_template[0]!r} is not an executable")
        return self.binary

    def is_installed(self) -> bool:
        return shutil.which(str(self.binary)) is not None

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        values = {"prompt": prompt, "model": endpoint.model, "base_url": endpoint.root, "workdir": str(dirs.workdir)}
        argv = [_substitute(arg, values) for arg in self.argv_template]
        argv[0] = str(self.binary)
        env = self.base_env(
            dirs,
            {
                "LODESTAR_GATEWAY_URL": endpoint.root,
                "LODESTAR_SESSION_KEY": endpoint.session_key,
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
        return Invocation(self.name, argv, env, dirs.workdir)


def _substitute(arg: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg
