"""Gemini CLI (`@google/gemini-cli`): Google `streamGenerateContent?alt=sse` at GOOGLE_GEMINI_BASE_URL.

Needs settings `security.auth.selectedType="gemini-api-key"` (else exit 41), a trusted workspace, and
always `-m MODEL` (without it, it first asks a router model with a JSON schema and retries for ~80 s).
Shell and write tools need `--yolo`. Its shell tool is `run_shell_command`. It can exit 0 after a
failure: check stdout and the captured calls.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

SETTINGS: dict[str, object] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}


class GeminiCli(Harness):
    name = "gemini_cli"
    binary_name = "gemini"
    shell_tool = "run_shell_command"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        path = write_json(dirs.home / ".gemini" / "settings.json", SETTINGS)
        env = self.base_env(
            dirs,
            {
                "GEMINI_API_KEY": endpoint.session_key,
                "GOOGLE_GEMINI_BASE_URL": endpoint.root,
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
                "GEMINI_MODEL": endpoint.model,
            },
        )
        argv = [str(self.binary), "-m", endpoint.model, "--yolo", "-p", prompt]
        return Invocation(self.name, argv, env, dirs.workdir, [path])
