"""Runs the OpenHands SDK's default coding agent once, non-interactively; prints its final answer.

Run by the OpenHands venv's own interpreter (Python >= 3.12, `openhands-sdk` + `openhands-tools`), never
by lodestar's: it imports nothing of lodestar. The gateway endpoint comes from the environment
(LODESTAR_BASE_URL ending in /v1, LODESTAR_SESSION_KEY, LODESTAR_MODEL), set by the `openhands` adapter
(services/gateway/lodestar_gateway/node/harnesses/openhands.py).

The agent is the SDK's standard one (`openhands.tools.preset.default.get_default_agent` with
cli_mode=True: terminal, file editor and task tracker tools, the SDK's system prompt and condenser), with
one change made through the SDK's own parameters: its terminal is the plain subprocess backend, not tmux
(a tmux server daemonizes out of the run's process group and outlives it). stdout holds only the final
answer (the `finish` tool's message or the last agent message); the SDK logs to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-iterations", type=int, default=100)
    args = parser.parse_args(argv)

    from openhands.sdk import LLM, Conversation  # type: ignore[import-not-found]
    from openhands.sdk.conversation.response_utils import (  # type: ignore[import-not-found]
        get_agent_final_response,
    )
    from openhands.tools.preset.default import get_default_agent  # type: ignore[import-not-found]
    from openhands.tools.terminal import TerminalTool  # type: ignore[import-not-found]
    from pydantic import SecretStr

    llm = LLM(
        model="openai/" + os.environ["LODESTAR_MODEL"],
        base_url=os.environ["LODESTAR_BASE_URL"],
        api_key=SecretStr(os.environ["LODESTAR_SESSION_KEY"]),
        usage_id="agent",
    )
    agent = get_default_agent(llm=llm, cli_mode=True)
    tools: list[Any] = [
        tool.model_copy(update={"params": {**tool.params, "terminal_type": "subprocess"}})
        if tool.name == TerminalTool.name
        else tool
        for tool in agent.tools
    ]
    agent = agent.model_copy(update={"tools": tools})
    conversation = Conversation(
        agent=agent, workspace=args.workdir, visualizer=None, max_iteration_per_run=args.max_iterations
    )
    conversation.send_message(args.prompt)
    conversation.run()
    print(get_agent_final_response(conversation.state.events))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
