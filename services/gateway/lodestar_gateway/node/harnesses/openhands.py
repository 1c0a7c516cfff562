"""The OpenHands SDK agent (`openhands-sdk` + `openhands-tools` from PyPI, its own Python >= 3.12).

The SDK is a library, not a program: `openhands_driver.py` (run by the harness's own interpreter, never
importing lodestar) builds the SDK's default coding agent (terminal, file editor and task tracker tools)
on an `LLM` pointed at the gateway's /v1 through litellm (`openai/<model>`), runs one conversation on the
prompt in the working directory, and prints the agent's final message. The environment turns the SDK's
telemetry off and keeps litellm from fetching its price list.
"""

from __future__ import annotations

from pathlib import Path

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs
from lodestar_gateway.node.harnesses.python_venv import harness_root

VENV = "openhands-venv"
DRIVER = Path(__file__).with_name("openhands_driver.py")

SWITCHES_OFF = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENHANDS_SUPPRESS_BANNER": "1",
    "LMNR_PROJECT_API_KEY": "",  # its Laminar tracing starts only with a key
    "OTEL_SDK_DISABLED": "true",
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "1",  # huggingface_hub telemetry
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class OpenHands(Harness):
    name = "openhands"
    binary_name = "python"
    shell_tool = "terminal"

    @property
    def binary(self) -> Path:
        """The interpreter of the OpenHands venv (a Python >= 3.12)."""
        return harness_root(self.bin_dir) / VENV / "bin" / self.binary_name

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        env = self.base_env(
            dirs,
            {
                **SWITCHES_OFF,
                "LODESTAR_BASE_URL": endpoint.root + "/v1",
                "LODESTAR_SESSION_KEY": endpoint.session_key,
                "LODESTAR_MODEL": endpoint.model,
            },
        )
        # -P: the driver's folder is not put on sys.path (this module would shadow the `openhands` package).
        argv = [str(self.binary), "-P", str(DRIVER), "--workdir", str(dirs.workdir), "--prompt", prompt]
        return Invocation(self.name, argv, env, dirs.workdir)
