"""The shipped gateway configuration never runs a session bare: with the isolation settings the image sets
(deploy/Dockerfile.gateway's ENV, read here) on a machine where the sandbox cannot be made (no bubblewrap,
no unshare on the node's PATH), a real node refuses the session (an infrastructure failure naming the
cause) and the agent never runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lodestar.settings import load_settings
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses.base import REPO_ROOT
from lodestar_gateway.settings import GatewaySettings
from tests.gateway.node.conftest import NodeFactory
from tests.gateway.node.standin import RolloutStandIn, assignment

pytestmark = pytest.mark.slow
ISOLATION = ("host_sandbox", "isolate_network", "mount_namespaces", "sandbox_hidden")
"""The settings that decide how a host session is isolated."""


def image_env(dockerfile: Path) -> dict[str, str]:
    """The variables of a Dockerfile's ENV instructions (KEY=VALUE form; continuation lines joined)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"(\w+)=(\S+)", line[4:])))
    return env


def test_the_image_env_is_read() -> None:
    env = image_env(REPO_ROOT / "deploy" / "Dockerfile.gateway")
    assert env["LODESTAR_GATEWAY_HOST_SANDBOX"] == "bwrap"
    assert env["LODESTAR_GATEWAY_DATA_DIR"] == "/var/lib/lodestar/gateway"


def test_the_shipped_gateway_refuses_a_session_it_cannot_isolate(
    node_factory: NodeFactory, standin: RolloutStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {key: value for key, value in image_env(REPO_ROOT / "deploy" / "Dockerfile.gateway").items()
           if key.startswith("LODESTAR_GATEWAY_")}  # fmt: skip
    shipped = load_settings(GatewaySettings, env=env)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # neither bwrap nor unshare can be found: nothing can isolate
    node_factory(None, **{name: getattr(shipped, name) for name in ISOLATION})
    marker = tmp_path / "ran-bare"
    agent = ["{python}", "-c", f"open({str(marker)!r}, 'w').write('the agent ran')"]
    standin.offer(assignment("bare", command=agent))

    result = standin.wait_results(1, timeout=60)[0]

    assert not marker.exists(), "the agent ran although it could not be isolated"
    assert result.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED, standin.describe(result)
    assert "sandbox" in result.error, result.error
