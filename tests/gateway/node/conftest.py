"""Fixtures of the node lifecycle tests: a RolloutService stand-in and gateway nodes attached to it.

- `standin`: a running `RolloutStandIn` (records AcquireSessions / CompleteSession, injects cancellations
  and failures).
- `node_factory(**settings)`: a scripted inference server + a gateway node that pulls from `standin`
  (real etcd membership, polling every 0.2 s); returns the `GatewayStack`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import StackFactory
from tests.gateway.node.standin import RolloutStandIn
from tests.gateway.stack import GatewayStack

REPO = Path(__file__).resolve().parents[3]
AGENT = ["{python}", "{repo}/examples/agent/agent.py", "{prompt}"]
HANG_AGENT = ["{python}", str(Path(__file__).with_name("hang_agent.py")), "{prompt}"]
NodeFactory = Callable[..., GatewayStack]


@pytest.fixture
def standin() -> Iterator[RolloutStandIn]:
    yield from RolloutStandIn.running()


@pytest.fixture
def node_factory(
    gateway_stack_factory: StackFactory, standin: RolloutStandIn, etcd_endpoint: str, etcd_prefix: str
) -> NodeFactory:
    def factory(script: dict[str, Any] | None = None, *, inference: bool = True, **settings: Any) -> GatewayStack:
        fields: dict[str, Any] = {
            "rollout": standin.address,
            "etcd": etcd_endpoint,
            "etcd_prefix": etcd_prefix,
            "poll_interval_s": 0.2,
            "slots": 2,
            "ready_buffer": 1,
            **settings,
        }
        return gateway_stack_factory(script, inference=inference, **fields)

    return factory


def sessions_dir(stack: GatewayStack) -> Path:
    return stack.data_dir / "gateway" / "sessions"


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_dead(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def read_pids(path: Path) -> list[int]:
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def kill_pids(pids: list[int]) -> None:
    """Test clean-up only: kill what a failed assertion left running (by pid, never by name)."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
