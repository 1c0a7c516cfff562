"""Qwen Code (`@qwen-code/qwen-code`): OpenAI Chat Completions at OPENAI_BASE_URL, streaming.

Settings in ~/.qwen/settings.json select the `openai` auth type and turn telemetry, usage statistics,
auto-update and managed auto-memory off (auto-memory adds a "memory extraction" call after text-only
turns). Shell and write tools need `--yolo`. Its shell tool is `run_shell_command`.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json


def settings(endpoint: GatewayEndpoint) -> dict[str, object]:
    return {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "memory": {"enableManagedAutoMemory": False},
        "model": {"name": endpoint.model},
    }


class QwenCode(Harness):
    name = "qwen_code"
    binary_name = "qwen"
    shell_tool = "run_shell_command"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        path = write_json(dirs.home / ".qwen" / "settings.json", settings(endpoint))
        env = self.base_env(
            dirs,
            {
                "OPENAI_BASE_URL": endpoint.root + "/v1",
                "OPENAI_API_KEY": endpoint.session_key,
                "OPENAI_MODEL": endpoint.model,
            },
        )
        argv = [str(self.binary), "--yolo", "--model", endpoint.model, "-p", prompt]
        return Invocation(self.name, argv, env, dirs.workdir, [path])
