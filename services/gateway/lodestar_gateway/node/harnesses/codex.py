"""Codex (`@openai/codex`, Rust binary): OpenAI Responses only, configured by $CODEX_HOME/config.toml.

`codex exec` streams `POST {base_url}/responses` and needs `response.completed`; the key comes from the
provider's `env_key` variable. The default sandbox is read-only, so runs use `-s workspace-write`. Its shell
tool is `shell` / `exec_command` depending on the model family it assumes.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import (
    GatewayEndpoint,
    Harness,
    Invocation,
    RunDirs,
    toml_string,
    write_text,
)

KEY_VARIABLE = "LODESTAR_SESSION_KEY"
PROVIDER = "lodestar"


def config_toml(endpoint: GatewayEndpoint) -> str:
    return "\n".join(
        [
            f"model = {toml_string(endpoint.model)}",
            f'model_provider = "{PROVIDER}"',
            "check_for_update_on_startup = false",
            'approval_policy = "never"',
            "",
            f"[model_providers.{PROVIDER}]",
            'name = "lodestar gateway"',
            f"base_url = {toml_string(endpoint.root + '/v1')}",
            f'env_key = "{KEY_VARIABLE}"',
            'wire_api = "responses"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "",
            "[otel]",
            'exporter = "none"',
            "",
        ]
    )


class Codex(Harness):
    name = "codex"
    binary_name = "codex"
    shell_tool = "shell"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        codex_home = dirs.home / ".codex"
        config = write_text(codex_home / "config.toml", config_toml(endpoint))
        env = self.base_env(
            dirs,
            {"CODEX_HOME": str(codex_home), KEY_VARIABLE: endpoint.session_key, "RUST_LOG": "error"},
        )
        argv = [
            str(self.binary),
            "exec",
            "--skip-git-repo-check",
            "--color",
            "never",
            "-s",
            "workspace-write",
            "-C",
            str(dirs.workdir),
            prompt,
        ]
        return Invocation(self.name, argv, env, dirs.workdir, [config])
