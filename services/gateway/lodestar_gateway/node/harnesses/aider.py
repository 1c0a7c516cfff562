"""aider (`aider-chat` from PyPI, its own venv): OpenAI Chat Completions through litellm, edits as text.

`aider --message <prompt>` runs one request/answer exchange unattended and exits: litellm's
`openai/<model>` provider at the gateway's /v1 (the key in OPENAI_API_KEY, the base in OPENAI_API_BASE),
`--yes-always` (it creates the files the model writes), no git (no repository, no commits), no update
check, no analytics, no lint, and every history file in the private HOME. aider sends NO tools: the
model edits files by writing them out in its edit format in plain text (for a model aider does not know,
`whole`: the file name, then the whole file in a fenced block), which aider parses and applies. Shell
commands the model suggests are never run unattended (`--yes-always` does not answer that question).
"""

from __future__ import annotations

from pathlib import Path

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs
from lodestar_gateway.node.harnesses.python_venv import venv_script

VENV = "aider-venv"
SWITCHES_OFF = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list at import
    "AIDER_ANALYTICS": "false",
    "AIDER_CHECK_UPDATE": "false",
    "AIDER_SHOW_RELEASE_NOTES": "false",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class Aider(Harness):
    name = "aider"
    binary_name = "aider"
    shell_tool = ""
    """aider offers no tools: its edits are text."""

    @property
    def binary(self) -> Path:
        return venv_script(self.bin_dir, VENV, self.binary_name)

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        history = dirs.home / ".aider"
        history.mkdir(parents=True, exist_ok=True)
        env = self.base_env(
            dirs,
            {**SWITCHES_OFF, "OPENAI_API_KEY": endpoint.session_key, "OPENAI_API_BASE": endpoint.root + "/v1"},
        )
        argv = [
            str(self.binary),
            "--model",
            f"openai/{endpoint.model}",
            "--yes-always",
            "--no-git",
            "--no-auto-commits",
            "--no-check-update",
            "--no-analytics",
            "--no-show-release-notes",
            "--no-show-model-warnings",
            "--no-check-model-accepts-settings",
            "--no-pretty",
            "--no-fancy-input",
            "--no-detect-urls",
            "--no-auto-lint",
            "--no-restore-chat-history",
            "--chat-history-file",
            str(history / "chat.md"),
            "--input-history-file",
            str(history / "input"),
            f"--message={prompt}",  # one argument: a prompt that starts with `-` is never read as an option
        ]
        return Invocation(self.name, argv, env, dirs.workdir, [])
