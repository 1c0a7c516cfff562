"""`HarnessSpec` -> the node's launcher adapter. The kind names and their validation are the kernel's
(`lodestar/kinds.py`, shared with rollout); this module picks each harness kind's adapter in `harnesses/`, whose
names are the kinds themselves (one spelling: `claude_code`, never `claude-code`).
"""

from __future__ import annotations

from pathlib import Path

from lodestar.kinds import COMMAND, pi_api, validate_harness
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, Harness, make_harness


def harness_for(
    spec: rollout_pb2.HarnessSpec, *, session_id: str, task_id: str, bin_dir: Path | None = None
) -> Harness:
    """The adapter that runs one session of `spec` (InvalidArgumentError for a spec rollout would refuse)."""
    validate_harness(spec)
    if spec.kind == COMMAND:
        return Command(list(spec.command), bin_dir=bin_dir, session_id=session_id, task_id=task_id)
    api = pi_api(spec)
    if api is not None:
        return make_harness(f"pi:{api}", bin_dir)
    return make_harness(spec.kind, bin_dir)  # a launcher's name is its harness kind
