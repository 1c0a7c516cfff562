"""opencode (`opencode-ai`, a compiled Bun binary): OpenAI Chat Completions through its bundled
`@ai-sdk/openai-compatible` provider, configured by a private `opencode.json`.

The config (OPENCODE_CONFIG) declares one custom provider whose base URL is the gateway's /v1 and whose
key is read from an environment variable (`{env:...}`), makes it the default model, allows every tool
without asking, and turns auto-update, sharing, LSP downloads and formatters off. The environment turns
off the models.dev catalogue fetch, default plugins, Claude Code compatibility (reading ~/.claude) and
the project config lookup. `opencode run` prints the final answer on stdout. Its shell tool is `bash`.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

PROVIDER = "lodestar"
KEY_VARIABLE = "LODESTAR_SESSION_KEY"
SESSION_TITLE = "lodestar"
"""A fixed session title: with one set, `opencode run` makes no title-generation call to the model."""

SWITCHES_OFF = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE_PROMPT": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE_SKILLS": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_TERMINAL_TITLE": "1",
}


def prompt_words(prompt: str) -> list[str]:
    """The prompt as `opencode run` arguments that it joins back into exactly `prompt`.

    `opencode run` joins its message arguments with spaces but wraps every argument that contains a space
    in double quotes (escaping inner quotes): one argument per space-free piece avoids that. After `--`,
    no piece is read as an option.
    """
    return prompt.split(" ")


def config(endpoint: GatewayEndpoint) -> dict[str, object]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "lodestar gateway",
                "options": {"baseURL": endpoint.root + "/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"},
                "models": {endpoint.model: {"name": endpoint.model}},
            }
        },
        "model": f"{PROVIDER}/{endpoint.model}",
        "small_model": f"{PROVIDER}/{endpoint.model}",
        "enabled_providers": [PROVIDER],
        "autoupdate": False,
        "share": "disabled",
        "lsp": False,
        "formatter": False,
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }


class OpenCode(Harness):
    name = "opencode"
    binary_name = "opencode"
    shell_tool = "bash"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        path = write_json(dirs.home / ".config" / "opencode" / "opencode.json", config(endpoint))
        env = self.base_env(dirs, {**SWITCHES_OFF, "OPENCODE_CONFIG": str(path), KEY_VARIABLE: endpoint.session_key})
        argv = [
            str(self.binary),
            "run",
            "--model",
            f"{PROVIDER}/{endpoint.model}",
            "--title",
            SESSION_TITLE,
            "--",
            *prompt_words(prompt),
        ]
        return Invocation(self.name, argv, env, dirs.workdir, [path])
