"""Cline CLI (npm `cline`, a compiled Bun binary): OpenAI Chat Completions through its `openai-compatible`
provider, configured by private settings files under ~/.cline.

`providers.json` (what `cline auth -p openai -b <url> -k <key> -m <model>` would write) selects the
`openai-compatible` provider with the gateway's /v1 as base URL, the session key and the model;
`global-settings.json` opts out of telemetry and turns the self-update off. `cline <prompt>` runs the prompt
unattended in act mode with every tool auto-approved and prints the final answer on stdout; the run ends
at the first reply without tool calls. CLINE_SESSION_BACKEND_MODE=local keeps the session in the process:
by default Cline also starts a detached "hub" daemon (its own session), which would outlive the run's
process group. Its shell tool is `run_commands` {commands: [...]}.
"""

from __future__ import annotations

from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs, write_json

PROVIDER = "openai-compatible"
SETTINGS_TIME = "2026-01-01T00:00:00.000Z"
"""A fixed `updatedAt` for the provider entry (any valid time: nothing compares it)."""

SWITCHES_OFF = {
    "CLINE_SESSION_BACKEND_MODE": "local",  # no background hub daemon: everything stays in the run's process
}


def provider_settings(endpoint: GatewayEndpoint) -> dict[str, object]:
    """`~/.cline/data/settings/providers.json`: the one provider, the gateway's endpoint and key."""
    settings = {
        "provider": PROVIDER,
        "apiKey": endpoint.session_key,
        "model": endpoint.model,
        "baseUrl": endpoint.root + "/v1",
    }
    return {
        "version": 1,
        "lastUsedProvider": PROVIDER,
        "modes": {},
        # Without `updatedAt` the entry is dropped, silently: the run falls back to Cline's own provider
        # (api.cline.bot).
        "providers": {PROVIDER: {"settings": settings, "updatedAt": SETTINGS_TIME, "tokenSource": "manual"}},
    }


GLOBAL_SETTINGS = {"telemetryOptOut": True, "autoUpdateEnabled": False}


class Cline(Harness):
    name = "cline"
    binary_name = "cline"
    shell_tool = "run_commands"

    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        settings = dirs.home / ".cline" / "data" / "settings"
        providers = write_json(settings / "providers.json", provider_settings(endpoint))
        global_settings = write_json(settings / "global-settings.json", GLOBAL_SETTINGS)
        env = self.base_env(dirs, SWITCHES_OFF)
        # After `--`, a prompt that starts with `-` is still the prompt.
        argv = [str(self.binary), "--provider", PROVIDER, "--model", endpoint.model, "--", prompt]
        return Invocation(self.name, argv, env, dirs.workdir, [providers, global_settings])
