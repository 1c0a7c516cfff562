"""A docker run's `options.mounts` are allow-listed by the node (`--docker-mounts-allowed`, default empty),
without a Docker daemon: the refusal comes before anything is staged or any docker command runs.

- `allowed_mounts`: with nothing allowed every mount is refused; an allowed directory and paths below it
  pass (resolved); a symlink out of an allowed directory, `/`, a directory holding the docker socket and a
  socket are refused even when allowed;
- `DockerBackend.create` refuses a disallowed mount with PERMISSION_DENIED and leaves nothing behind;
- through a real node (scripted inference, real gateway, rollout stand-in) the session fails as an
  infrastructure failure whose error names the mount and the setting.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from google.protobuf import struct_pb2

from lodestar.errors import PermissionDeniedError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.runtimes import DockerBackend
from lodestar_gateway.node.runtimes.docker_cli import DockerCli
from lodestar_gateway.node.runtimes.docker_spec import allowed_mounts
from tests.gateway.node.conftest import AGENT, NodeFactory, sessions_dir
from tests.gateway.node.standin import RolloutStandIn, assignment


def _docker_spec(*mounts: str) -> rollout_pb2.RuntimeSpec:
    spec = rollout_pb2.RuntimeSpec(kind="docker", image="lodestar/session-base:dev")
    spec.options.CopyFrom(struct_pb2.Struct())
    spec.options.update({"mounts": list(mounts)})
    return spec


def test_with_nothing_allowed_every_mount_is_refused(tmp_path: Path) -> None:
    assert allowed_mounts([], []) == []
    for mount in (str(tmp_path), "/", "/var/run/docker.sock", "/usr/share"):
        with pytest.raises(PermissionDeniedError, match="--docker-mounts-allowed"):
            allowed_mounts([mount], [])


def test_allowed_directories_and_below_pass_resolved(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "verifiers").mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    both = [data.resolve(), (data / "verifiers").resolve()]
    assert allowed_mounts([str(data), str(data / "verifiers")], [data]) == both
    assert allowed_mounts([str(data / "verifiers")], [tmp_path / "link"]) == [(data / "verifiers").resolve()]
    (data / "escape").symlink_to("/etc")
    for outside in (str(tmp_path), str(data / "escape"), f"{data}/../other", "/etc"):
        with pytest.raises(PermissionDeniedError):
            allowed_mounts([outside], [data])


def test_the_root_the_docker_socket_and_sockets_are_refused_even_when_allowed(tmp_path: Path) -> None:
    for mount in ("/", "/run", "/var/run"):
        with pytest.raises(PermissionDeniedError, match="root or docker"):
            allowed_mounts([mount], [Path("/")])
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(tmp_path / "agent.sock"))
        with pytest.raises(PermissionDeniedError, match="root or docker"):
            allowed_mounts([str(tmp_path / "agent.sock")], [tmp_path])
    finally:
        listener.close()


async def test_the_backend_refuses_a_disallowed_mount_before_staging_anything(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    backend = DockerBackend(
        tmp_path / "sessions", node_id="n", reaper=False, cli=DockerCli(str(tmp_path / "no-docker")),
        mounts_allowed=[allowed],
    )  # fmt: skip
    for mount in ("/", "/var/run/docker.sock", str(tmp_path)):
        with pytest.raises(PermissionDeniedError):
            await backend.create("s1-a1", {"a.txt": "x"}, _docker_spec(mount))
    assert not (tmp_path / "sessions" / "s1-a1").exists()
    assert not DockerBackend(tmp_path / "sessions", node_id="n", reaper=False).mounts_allowed


@pytest.mark.slow
def test_a_node_fails_the_session_of_a_disallowed_mount_naming_it(
    node_factory: NodeFactory, standin: RolloutStandIn
) -> None:
    stack = node_factory({"replies": [{"text": "done"}]}, slots=1, ready_buffer=0)
    message = assignment("mount-root", command=AGENT)
    message.runtime.CopyFrom(_docker_spec("/"))
    standin.offer(message)
    (result,) = standin.wait_results(1, timeout=60)
    assert result.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED, standin.describe(result)
    assert "docker mount '/'" in result.error
    assert "--docker-mounts-allowed" in result.error
    assert not sessions_dir(stack).exists() or list(sessions_dir(stack).iterdir()) == []  # nothing was staged
