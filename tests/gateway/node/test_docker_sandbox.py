"""The `docker` runtime against the evil agent (marker `docker`, `make test-docker`): the script of
`evil_agent.py` run as the harness of a real session container, next to a second session and a node data
directory with a secret, must fail at every attack; the session runs as an unprivileged user with no
capability, yet owns its files; the verifier's private directory works for that user (the command
verifier's reward file) and the node never writes through a link the agent planted."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint
from lodestar_gateway.node.runtimes import DockerBackend, DockerRuntime
from lodestar_gateway.node.runtimes.docker_spec import SESSION_UID
from lodestar_gateway.node.verifiers import VerifierInput, make_verifier
from tests.docker_support import SESSION_IMAGE, docker_backend
from tests.gateway.node.evil_agent import ESCAPES, EVIL, gateway_port, other_port

__all__ = ["gateway_port", "other_port"]  # fixtures
pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[DockerBackend]:
    async with docker_backend(tmp_path / "sessions", f"evil-{uuid.uuid4().hex[:6]}") as made:
        yield made


def _spec() -> rollout_pb2.RuntimeSpec:
    return rollout_pb2.RuntimeSpec(kind="docker", image=SESSION_IMAGE)


async def _run(runtime: DockerRuntime, argv: list[str], gateway: int) -> Any:
    base_url = f"http://127.0.0.1:{gateway}"
    invocation = runtime.translate(Command(argv).prepare(runtime.real, GatewayEndpoint(base_url, "lsk-test", "m"), "p"))
    return await runtime.run_harness(invocation, base_url, 60)


async def test_the_evil_agent_is_contained_in_its_container(
    backend: DockerBackend, tmp_path: Path, gateway_port: int, other_port: int
) -> None:
    data_dir = tmp_path / "node-data"
    data_dir.mkdir()
    (data_dir / "capture.sqlite").write_text("session keys")
    other = await backend.create("other-a1", {"secret.txt": "the other session's work"}, _spec())
    mine = await backend.create("mine-a1", {}, _spec())
    host_file = Path.cwd() / f".sandbox-probe-{os.getpid()}"
    targets = {"other_session_file": str(other.real.workdir / "secret.txt"), "node_secret": str(data_dir /
               "capture.sqlite"), "host_file": str(host_file), "node_pid": os.getpid(), "other_port": other_port,
               "gateway_port": gateway_port, "node_install": sys.prefix}  # fmt: skip
    try:
        result = await _run(mine, ["{python}", "-c", EVIL, json.dumps(targets)], gateway_port)
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout.strip().splitlines()[-1])
        own = mine.real.workdir / "own.txt"
        assert own.exists(), "the session's own files are writable"
        assert (own.stat().st_uid, own.stat().st_gid) == (SESSION_UID, SESSION_UID)
        assert mine.root.stat().st_uid == os.getuid(), "the private root itself stays the node's"
    finally:
        wrote_host = host_file.exists()
        host_file.unlink(missing_ok=True)
        await mine.cleanup()
        await other.cleanup()
    for attack in ESCAPES:
        assert not found[attack], f"{attack} succeeded in the container: {found}"
    assert not wrote_host
    assert found["reach_gateway"], "the gateway stays reachable"
    assert found["write_own_workspace"]
    assert found["processes_visible"] <= 4, found  # docker-init, sleep, the harness, maybe its child


def _given(runtime: DockerRuntime) -> VerifierInput:
    return VerifierInput(
        task=rollout_pb2.Task(task_id="t1", prompt="p"), final_answer="done",
        workspace=runtime.visible.workdir, timed_out=False, run=runtime.run_process, scratch=runtime.real.tmpdir,
        scratch_visible=runtime.visible.tmpdir, runtime_kind=runtime.kind, root=runtime.root,
        workspace_host=runtime.real.workdir, owner=runtime.owner,
    )  # fmt: skip


PLANT = r"""
import os, sys
from pathlib import Path
tmp, victim = Path(os.environ["TMPDIR"]), sys.argv[1]  # the victim: a directory of the node's host
Path(tmp, "lodestar-verifier-input.json").symlink_to(victim + "/owned.json")
for name in ("a", "b", "c"):
    Path(tmp, f".lodestar-verifier-{name}").symlink_to(victim)
try:
    os.rename(tmp, tmp.with_name("tmp-moved"))
    print("renamed")
except OSError as error:
    print("rename refused:", error.strerror)
"""


async def test_the_verifier_runs_as_the_session_user_and_never_follows_its_links(
    backend: DockerBackend, tmp_path: Path, gateway_port: int
) -> None:
    """A root node writes the verifier's input and reads its reward file below a TMPDIR full of the agent's
    links: nothing lands on the host, and the reward file (in a directory given to the session's user) works.
    (The python verifier's input file goes through the same private directory: test_reward_hacking.py.)"""
    runtime = await backend.create("links-a1", {}, _spec())
    victim = tmp_path / "victim"
    victim.mkdir()
    try:
        planted = await _run(runtime, ["{python}", "-c", PLANT, str(victim)], gateway_port)
        assert planted.returncode == 0, planted.stderr
        assert "rename refused" in planted.stdout, "the agent cannot swap its TMPDIR for a link"

        spec = rollout_pb2.VerifierSpec(kind="command")
        spec.config.update({"command": "id -u > uid.txt", "score": 'echo 0.75 > "$LODESTAR_REWARD_FILE"'})
        verdict = await make_verifier(spec).score(_given(runtime))
        assert (verdict.reward, verdict.details["reward_from"]) == (0.75, "file"), verdict.details
        assert (runtime.real.workdir / "uid.txt").read_text().strip() == str(SESSION_UID)
    finally:
        await runtime.cleanup()
    assert list(victim.iterdir()) == []
