"""How many prompt tokens each installed harness's first call takes with a given model's tokenizer: which
harnesses fit a small model's context (issue 41's question for SmolLM2-135M, 8,192 tokens).

    python bench/harness_prompts.py [--model DIR] [--prompt TEXT] [--harness KIND ...]

Each harness runs one session, unmodified, through a real gateway node against the scripted engine serving
`--model`'s tokenizer and chat template (it answers with the prompt's own words, so most sessions end after
their first call); the longest prompt a session sent (recorded, or refused as over the context: the size is in
the refusal) is that harness's fixed cost per session, since the first real call carries its whole system
prompt and tools. A harness
whose binary is not installed (`make harnesses`) is listed as such. Prints a table; `--json` a row per line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lodestar.kinds import COMMAND, HARNESS_KINDS  # noqa: E402
from lodestar_gateway.node.harnesses import GatewayEndpoint, Launcher, RunDirs, make_harness  # noqa: E402
from tests.gateway.stack import GatewayStack  # noqa: E402

DEFAULT_MODEL = ROOT / ".lodestar" / "models" / "smollm2"
DEFAULT_PROMPT = "What is the capital of Nepal?"
RUN_TIMEOUT_S = 300.0
_REFUSED = re.compile(r"(?:prompt has|resulted in) (\d+) tokens")
"""The gateway's refusal of a prompt over the context (each dialect's wording keeps these words)."""


def _context_length(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    return int(config.get("max_position_embeddings", 0))


async def _first_call(stack: GatewayStack, kind: str, prompt: str, work: Path) -> dict[str, Any]:
    harness = make_harness(kind)
    if not harness.is_installed():
        return {"harness": kind, "installed": False}
    session = stack.open_session(harness=kind)
    endpoint = GatewayEndpoint(stack.http_base_url, session.key, "smollm2")
    invocation = harness.prepare(RunDirs.under(work / kind), endpoint, prompt)
    result = await Launcher(isolate_network=True).run(invocation, stack.http_base_url, timeout_s=RUN_TIMEOUT_S)
    calls = stack.calls(session.session_id)
    row: dict[str, Any] = {"harness": kind, "installed": True, "calls": len(calls), "rc": result.returncode}
    sizes = [len(call.prompt_token_ids) for call in calls]
    # A call over the context is refused, not recorded: its size is in the refusal the harness printed.
    sizes += [int(found) for found in _REFUSED.findall(result.stdout + result.stderr)]
    assert stack.node is not None
    refused = stack.node.proxy.unanswered.get(session.session_id)
    if refused is not None:  # (failed calls, the last one's message, whether it was the agent's doing)
        sizes += [int(found) for found in _REFUSED.findall(refused[1])]
    if sizes:
        row["prompt_tokens"] = max(sizes)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--harness", action="append", help="a harness kind (repeatable; default: all)")
    parser.add_argument("--json", action="store_true", help="a JSON row per harness instead of the table")
    args = parser.parse_args(argv)
    kinds = args.harness or [kind for kind in HARNESS_KINDS if kind != COMMAND]
    context = _context_length(args.model)
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        GatewayStack.start(Path(tmp), args.model, script={"default": {"echo": True}}) as stack,
    ):
        for kind in kinds:
            row = asyncio.run(_first_call(stack, kind, args.prompt, Path(tmp)))
            rows.append(row)
            print(json.dumps(row) if args.json else _line(row, context), flush=True)
    return 0


def _line(row: dict[str, Any], context: int) -> str:
    if not row["installed"]:
        return f"| {row['harness']} | not installed | |"
    tokens = row.get("prompt_tokens")
    if tokens is None:
        return f"| {row['harness']} | no call seen (rc {row['rc']}) | |"
    fits = "fits" if tokens < context else f"over by {tokens - context:,}"
    return f"| {row['harness']} | {tokens:,} | {fits} ({context:,}) |"


if __name__ == "__main__":
    raise SystemExit(main())
