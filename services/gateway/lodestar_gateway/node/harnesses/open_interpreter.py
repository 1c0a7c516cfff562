"""Open Interpreter (`open-interpreter` from PyPI, its own venv): OpenAI Chat Completions through litellm.

`interpreter --profile <file>` loads a Python profile of ours (Open Interpreter's own config format: a
script run with `interpreter` in scope) written into the private HOME: litellm's `openai/<model>` at the
gateway's /v1 with the session key (both read from the environment), function calling on, code run
without asking (`auto_run`), offline (no update check, no model metadata fetch), telemetry off, and the
prompt as the chat's first user message (what its `i <words>` shortcut does, without the words' rewrite).
It answers that message, then reads its next one from stdin, which is /dev/null: end of input ends the
run. Its one tool is `execute` {language, code}.
"""

from __future__ import annotations

from pathlib import Path

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_text
from lodestar_gateway.node.harnesses.python_venv import venv_script

VENV = "open-interpreter-venv"
KEY_VARIABLE = "LODESTAR_SESSION_KEY"
BASE_VARIABLE = "LODESTAR_API_BASE"
MODEL_VARIABLE = "LODESTAR_MODEL"
PROMPT_VARIABLE = "LODESTAR_PROMPT"
PROFILE = f"""import os

interpreter.llm.model = "openai/" + os.environ["{MODEL_VARIABLE}"]
interpreter.llm.api_base = os.environ["{BASE_VARIABLE}"]
interpreter.llm.api_key = os.environ["{KEY_VARIABLE}"]
interpreter.llm.supports_functions = True
interpreter.auto_run = True
interpreter.offline = True
interpreter.disable_telemetry = True
interpreter.plain_text_display = True
interpreter.messages = [{{"role": "user", "type": "message", "content": os.environ["{PROMPT_VARIABLE}"]}}]
"""
"""The profile: every value from the environment, so the file holds no secret and no prompt."""
SWITCHES_OFF = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list at import
    "DISABLE_TELEMETRY": "true",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class OpenInterpreter(Harness):
    name = "open_interpreter"
    binary_name = "interpreter"
    shell_tool = "execute"

    @property
    def binary(self) -> Path:
        return venv_script(self.bin_dir, VENV, self.binary_name)

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        profile = write_text(dirs.home / ".config" / "open-interpreter" / "profiles" / "lodestar.py", PROFILE)
        env = self.base_env(
            dirs,
            {
                **SWITCHES_OFF,
                KEY_VARIABLE: endpoint.session_key,
                BASE_VARIABLE: endpoint.root + "/v1",
                MODEL_VARIABLE: endpoint.model,
                PROMPT_VARIABLE: prompt,
            },
        )
        argv = [str(self.binary), "--profile", str(profile), "--plain"]
        return Invocation(self.name, argv, env, dirs.workdir, [profile])
