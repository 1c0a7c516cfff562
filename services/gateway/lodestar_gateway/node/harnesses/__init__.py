"""Harness launchers: one small adapter per harness (config files, env, flags) and the process launcher.

`make_harness(name)` returns an adapter; `Launcher.run` runs what it prepared. Harness names are the harness
kinds of `lodestar/kinds.py`: claude_code, codex, qwen_code, gemini_cli, pi (optionally `pi:<api>`, e.g.
`pi:anthropic-messages`), opencode, continue_cli, cline, mini_swe_agent, aider, open_interpreter and openhands.
"""

from __future__ import annotations

from pathlib import Path

from lodestar.errors import InvalidArgumentError
from lodestar.kinds import DEFAULT_PI_API, PI_APIS, kind_hint, parse_pi_api
from lodestar_gateway.node.harnesses.aider import Aider
from lodestar_gateway.node.harnesses.base import GatewayEndpoint, Harness, Invocation, RunDirs
from lodestar_gateway.node.harnesses.claude_code import ClaudeCode
from lodestar_gateway.node.harnesses.cline import Cline
from lodestar_gateway.node.harnesses.codex import Codex
from lodestar_gateway.node.harnesses.command import Command
from lodestar_gateway.node.harnesses.continue_cli import ContinueCli
from lodestar_gateway.node.harnesses.gemini_cli import GeminiCli
from lodestar_gateway.node.harnesses.launcher import HarnessResult, Launcher
from lodestar_gateway.node.harnesses.mini_swe_agent import MiniSweAgent
from lodestar_gateway.node.harnesses.open_interpreter import OpenInterpreter
from lodestar_gateway.node.harnesses.opencode import OpenCode
from lodestar_gateway.node.harnesses.openhands import OpenHands
from lodestar_gateway.node.harnesses.pi import Pi
from lodestar_gateway.node.harnesses.qwen_code import QwenCode

BUILTIN: dict[str, type[Harness]] = {
    ClaudeCode.name: ClaudeCode,
    Codex.name: Codex,
    QwenCode.name: QwenCode,
    GeminiCli.name: GeminiCli,
    Pi.name: Pi,
    OpenCode.name: OpenCode,
    ContinueCli.name: ContinueCli,
    Cline.name: Cline,
    MiniSweAgent.name: MiniSweAgent,
    Aider.name: Aider,
    OpenInterpreter.name: OpenInterpreter,
    OpenHands.name: OpenHands,
}
HARNESS_NAMES: tuple[str, ...] = (*BUILTIN, *(f"pi:{api}" for api in PI_APIS))


def make_harness(name: str, bin_dir: Path | None = None) -> Harness:
    """The adapter for a built-in harness name (see module docstring)."""
    base, _, variant = name.partition(":")
    if base == Pi.name:
        return Pi(api=parse_pi_api(variant or DEFAULT_PI_API), bin_dir=bin_dir)
    if variant or base not in BUILTIN:
        raise InvalidArgumentError(f"unknown harness {name!r}{kind_hint(name)}; one of {', '.join(HARNESS_NAMES)}")
    return BUILTIN[base](bin_dir)


__all__ = [
    "HARNESS_NAMES",
    "Aider",
    "ClaudeCode",
    "Cline",
    "Codex",
    "Command",
    "ContinueCli",
    "GatewayEndpoint",
    "GeminiCli",
    "Harness",
    "HarnessResult",
    "Invocation",
    "Launcher",
    "MiniSweAgent",
    "OpenCode",
    "OpenHands",
    "OpenInterpreter",
    "Pi",
    "QwenCode",
    "RunDirs",
    "make_harness",
]
