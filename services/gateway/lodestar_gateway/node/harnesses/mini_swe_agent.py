"""mini-swe-agent (`mini-swe-agent` from PyPI, its own venv): OpenAI Chat Completions through litellm.

`mini -y --exit-immediately` runs its default config (`mini.yaml`: tool calling, ONE tool `bash`
{command}) plus a config file of ours, without any prompt: litellm's `openai/<model>` provider at the
gateway's /v1 (the key in OPENAI_API_KEY), cost tracking off (no price for the model: it would abort the
run), no cost limit, no trajectory outside the private HOME. Every reply must call `bash`: a reply
without a tool call is a format error (three in a row end the run). The agent finishes when a command's
output starts with the line `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; the rest of that output is its
"submission" (in the trajectory file, not on stdout). Requests are not streamed.
"""

from __future__ import annotations

from pathlib import Path

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json
from lodestar_gateway.node.harnesses.python_venv import venv_script

VENV = "mini-swe-agent-venv"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first output line of the command that ends a run."""

SWITCHES_OFF = {
    "MSWEA_CONFIGURED": "true",  # no first-run setup wizard (it prompts for a model and key)
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list at import
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",  # huggingface_hub telemetry
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def config(endpoint: GatewayEndpoint) -> dict[str, object]:
    """Merged over the built-in `mini.yaml` (which keeps its prompts and tool)."""
    return {
        "agent": {"mode": "yolo", "confirm_exit": False, "cost_limit": 0},
        "model": {
            "model_name": f"openai/{endpoint.model}",
            "model_class": "litellm",
            "cost_tracking": "ignore_errors",
            "model_kwargs": {"api_base": endpoint.root + "/v1", "drop_params": True},
        },
        "environment": {"environment_class": "local"},
    }


class MiniSweAgent(Harness):
    name = "mini_swe_agent"
    binary_name = "mini"
    shell_tool = "bash"

    @property
    def binary(self) -> Path:
        return venv_script(self.bin_dir, VENV, self.binary_name)

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        config_dir = dirs.home / ".config" / "mini-swe-agent"
        path = write_json(config_dir / "lodestar.yaml", config(endpoint))  # JSON is YAML
        env = self.base_env(
            dirs,
            {**SWITCHES_OFF, "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir), "OPENAI_API_KEY": endpoint.session_key},
        )
        argv = [
            str(self.binary),
            "--yolo",
            "--exit-immediately",
            "-c",
            "mini.yaml",
            "-c",
            str(path),
            "--task",
            prompt,
            "--output",
            str(dirs.home / "trajectory.json"),
        ]
        return Invocation(self.name, argv, env, dirs.workdir, [path])
