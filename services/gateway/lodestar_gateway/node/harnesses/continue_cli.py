"""Continue CLI (`@continuedev/cli`, the `cn` bundle on node.js): OpenAI Chat Completions through its
`openai` provider, configured by a private `config.yaml`.

The config declares one model whose `apiBase` is the gateway's /v1 and whose key is the session key, with
the chat/edit/apply roles and tool use on. `cn -p` (print mode) runs the prompt unattended and prints the
final answer on stdout; `--auto` allows every tool without asking. CONTINUE_GLOBAL_DIR keeps its state
(sessions, settings) in the private HOME; telemetry and the self-update are off. Its shell tool is `Bash`.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

SWITCHES_OFF = {
    "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
    "CONTINUE_METRICS_ENABLED": "0",
    "CONTINUE_CLI_AUTO_UPDATED": "1",  # as if just updated: no self-update
    "CONTINUE_API_BASE": "http://127.0.0.1:9/",  # no hub: a refused local port, never api.continue.dev
}


def config(endpoint: GatewayEndpoint) -> dict[str, object]:
    return {
        "name": "lodestar",
        "version": "1.0.0",
        "schema": "v1",
        "models": [
            {
                "name": endpoint.model,
                "provider": "openai",
                "model": endpoint.model,
                "apiBase": endpoint.root + "/v1",
                "apiKey": endpoint.session_key,
                "roles": ["chat", "edit", "apply"],
                "capabilities": ["tool_use"],
            }
        ],
    }


class ContinueCli(Harness):
    name = "continue_cli"
    binary_name = "cn"
    shell_tool = "Bash"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        continue_home = dirs.home / ".continue"
        path = write_json(continue_home / "lodestar.yaml", config(endpoint))  # JSON is YAML
        env = self.base_env(dirs, {**SWITCHES_OFF, "CONTINUE_GLOBAL_DIR": str(continue_home)})
        # After `--`, a prompt that starts with `-` is still the prompt.
        argv = [str(self.binary), "--config", str(path), "--auto", "--print", "--", prompt]
        return Invocation(self.name, argv, env, dirs.workdir, [path])
