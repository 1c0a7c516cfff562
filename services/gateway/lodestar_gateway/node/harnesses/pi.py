"""Pi (`@mariozechner/pi-coding-agent`): any of four APIs, per provider in ~/.pi/agent/models.json.

One adapter per API: `openai-completions` and `openai-responses` (base URL .../v1),
`anthropic-messages` (base URL without /v1: the SDK appends it), `google-generative-ai` (.../v1beta).
The session key travels in an environment variable named by
`apiKey`. A bad stream fails SILENTLY (rc 0, no output): check stdout and the captured calls. Its shell tool is
`bash`.
"""

from __future__ import annotations

from pathlib import Path

from lodestar.kinds import DEFAULT_PI_API, PiApi
from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

PROVIDER = "lodestar"
KEY_VARIABLE = "LODESTAR_SESSION_KEY"
"""models.json names this variable instead of holding the key: Pi resolves an `apiKey` as a shell command
when it starts with "!", else as an environment variable name, else as a literal."""

_BASE_PATH: dict[PiApi, str] = {
    "openai-completions": "/v1",
    "openai-responses": "/v1",
    "anthropic-messages": "",
    "google-generative-ai": "/v1beta",
}


def models_json(endpoint: GatewayEndpoint, api: PiApi) -> dict[str, object]:
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": endpoint.root + _BASE_PATH[api],
                "api": api,
                "apiKey": KEY_VARIABLE,
                "models": [{"id": endpoint.model, "reasoning": False, "input": ["text"]}],
            }
        }
    }


class Pi(Harness):
    name = "pi"
    binary_name = "pi"
    shell_tool = "bash"

    def __init__(self, api: PiApi = DEFAULT_PI_API, bin_dir: Path | None = None) -> None:
        super().__init__(bin_dir)
        self.api: PiApi = api

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        agent_dir = dirs.home / ".pi" / "agent"
        models = write_json(agent_dir / "models.json", models_json(endpoint, self.api))
        settings = write_json(agent_dir / "settings.json", {"enableInstallTelemetry": False})
        env = self.base_env(
            dirs,
            {
                "PI_OFFLINE": "1",
                "PI_SKIP_VERSION_CHECK": "1",
                "PI_TELEMETRY": "0",
                "PI_CODING_AGENT_DIR": str(agent_dir),
                KEY_VARIABLE: endpoint.session_key,
            },
        )
        argv = [str(self.binary), "--provider", PROVIDER, "--model", endpoint.model, "-p", prompt]
        return Invocation(f"{self.name}:{self.api}", argv, env, dirs.workdir, [models, settings])
