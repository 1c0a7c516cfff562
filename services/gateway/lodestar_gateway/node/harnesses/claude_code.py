"""Claude Code (`@anthropic-ai/claude-code`, native binary): Anthropic Messages at ANTHROPIC_BASE_URL.

It sends `POST /v1/messages?beta=true` (streaming; x-api-key from ANTHROPIC_API_KEY) after a `HEAD /`
probe. As root, `--dangerously-skip-permissions` is refused unless IS_SANDBOX=1. Its shell tool is `Bash`.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

SWITCHES_OFF = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_UPDATES": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
}


class ClaudeCode(Harness):
    name = "claude_code"
    binary_name = "claude"
    shell_tool = "Bash"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        settings = write_json(
            dirs.home / ".claude" / "settings.json",
            {"autoUpdates": False, "includeCoAuthoredBy": False, "env": {}},
        )
        state = write_json(
            dirs.home / ".claude.json",
            {"hasCompletedOnboarding": True, "autoUpdates": False, "bypassPermissionsModeAccepted": True},
        )
        env = self.base_env(
            dirs,
            {
                **SWITCHES_OFF,
                "ANTHROPIC_BASE_URL": endpoint.root,
                "ANTHROPIC_API_KEY": endpoint.session_key,
                "ANTHROPIC_MODEL": endpoint.model,
                # Background helpers (titles, summaries) would otherwise ask for a Haiku model by name.
                "ANTHROPIC_SMALL_FAST_MODEL": endpoint.model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model,
                "IS_SANDBOX": "1",
            },
        )
        argv = [
            str(self.binary),
            "-p",
            prompt,
            "--model",
            endpoint.model,
            "--output-format",
            "text",
            "--dangerously-skip-permissions",
            "--allowedTools",
            "Bash",
        ]
        return Invocation(self.name, argv, env, dirs.workdir, [settings, state])
