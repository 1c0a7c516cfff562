"""A run spec cannot steer the node's own docker client (docs/security.md, "Smaller hardening"): a real
docker CLI talks to a recording Engine API endpoint (`docker_recorder.py`), which shows what each argv
meant to docker; no daemon is needed.

- `DOCKER_*` in a session's environment is refused, and never redirects the node's client to another daemon;
  the container's PATH reaches it by value while the client keeps the node's own;
- an image reference that reads as a flag is refused, and a good one follows `--`;
- a mount path with a comma is refused, and a node path with one stays one `--mount` field;
- rollout refuses all three at CreateRun.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import struct_pb2

from lodestar.docker_refs import check_image
from lodestar.errors import InvalidArgumentError, LodestarError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import RunDirs
from lodestar_gateway.node.runtimes import DockerBackend
from lodestar_gateway.node.runtimes.docker import DockerRuntime
from lodestar_gateway.node.runtimes.docker_cli import DockerCli
from lodestar_rollout.spec import validate_spec
from tests.gateway.node.docker_recorder import DockerRecorder

needs_cli = pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI (no daemon)")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (a Unix socket path is at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="h6d-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node_daemon(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DockerRecorder]:
    """The daemon the node's docker client is configured for (its DOCKER_HOST)."""
    with DockerRecorder(short_dir / "node.sock") as daemon:
        monkeypatch.setenv("DOCKER_HOST", daemon.url)
        yield daemon


def _spec(image: str = "lodestar/session-base:dev", mounts: list[str] | None = None) -> rollout_pb2.RuntimeSpec:
    spec = rollout_pb2.RuntimeSpec(kind="docker", image=image)
    if mounts is not None:
        spec.options.CopyFrom(struct_pb2.Struct())
        spec.options.update({"mounts": mounts})
    return spec


def _runtime(root: Path) -> DockerRuntime:
    dirs = RunDirs.under(root)
    return DockerRuntime(root, dirs, dirs, "lodestar-s1", "img", _spec(), [], "", "score", DockerCli(), pid=1)


async def _create(backend: DockerBackend, spec: rollout_pb2.RuntimeSpec) -> LodestarError | None:
    try:
        await backend.create("s1-a1", {"a.txt": "x"}, spec)
    except LodestarError as error:
        return error
    return None


@needs_cli
async def test_docker_variables_in_the_session_env_never_redirect_the_node_client(
    short_dir: Path, node_daemon: DockerRecorder
) -> None:
    runtime = _runtime(short_dir / "root")
    with DockerRecorder(short_dir / "agent.sock") as attacker:
        for name in ("DOCKER_HOST", "docker_host", "DOCKER_CONTEXT"):
            try:
                await runtime.run_process(["true"], {name: attacker.url}, timeout_s=30)
                error: LodestarError | None = None
            except LodestarError as raised:
                error = raised
            assert attacker.requests == [], f"{name} in the session env sent the node's docker client elsewhere"
            assert isinstance(error, InvalidArgumentError), error
            assert name in error.message
    assert node_daemon.posts("/exec") == [], "nothing was executed"

    await runtime.run_process(["true"], {"SESSION_SECRET": "s3"}, timeout_s=30)
    (created,) = node_daemon.posts("/exec")
    assert "SESSION_SECRET=s3" in created["Env"], created["Env"]
    assert any(item.startswith("PATH=/opt/lodestar/node/bin") for item in created["Env"]), "the container's PATH"


@needs_cli
async def test_an_image_reference_cannot_add_docker_flags(short_dir: Path, node_daemon: DockerRecorder) -> None:
    backend = DockerBackend(short_dir / "sessions", node_id="n", reaper=False)
    for image in ("--privileged", "--volume=/:/host", "-v/:/host", "ubuntu --privileged", "Ubuntu"):
        error = await _create(backend, _spec(image))
        privileged = [body for body in node_daemon.posts("/containers/create") if body["HostConfig"]["Privileged"]]
        assert privileged == [], f"image {image!r} made a privileged container"
        assert isinstance(error, InvalidArgumentError), error
        assert "image reference" in error.message
    assert node_daemon.posts("/containers/create") == []
    assert not (short_dir / "sessions" / "s1-a1").exists()

    for image in ("lodestar/session-base:dev", "localhost:5000/team/img:1.0", "python@sha256:" + "a" * 64):
        await _create(backend, _spec(image))
        assert node_daemon.posts("/containers/create")[-1]["Image"] == image


@needs_cli
async def test_a_comma_in_a_mount_path_cannot_add_mount_fields(short_dir: Path, node_daemon: DockerRecorder) -> None:
    allowed = short_dir / "allowed"
    planted = allowed / "data,source=" / "etc"  # the path `<allowed>/data,source=/etc`
    planted.mkdir(parents=True)
    backend = DockerBackend(short_dir / "sessions", node_id="n", reaper=False, mounts_allowed=[allowed])
    error = await _create(backend, _spec(mounts=[str(planted)]))
    sources = [m["Source"] for body in node_daemon.posts("/containers/create") for m in body["HostConfig"]["Mounts"]]
    assert "/etc" not in sources, "the mount path mounted the host's /etc"
    assert isinstance(error, InvalidArgumentError), error
    assert "comma" in error.message

    odd = DockerBackend(short_dir / "sess,target=x", node_id="n", reaper=False)  # the node's own paths: quoted
    await _create(odd, _spec())
    (created,) = node_daemon.posts("/containers/create")
    assert created["HostConfig"]["Mounts"][0]["Source"] == str(short_dir / "sess,target=x" / "s1-a1")


def test_rollout_refuses_them_at_create_run() -> None:
    def run(**runtime: object) -> rollout_pb2.RunSpec:
        spec = rollout_pb2.RunSpec(group_size=1, tasks=[rollout_pb2.Task(task_id="t", prompt="p")])
        spec.harness.kind = "command"
        spec.harness.command.append("true")
        spec.verifier.kind = "command"
        spec.runtime.CopyFrom(_spec(**runtime))  # type: ignore[arg-type]
        return spec

    validate_spec(run())
    with pytest.raises(InvalidArgumentError, match="image reference"):
        validate_spec(run(image="--privileged"))
    with pytest.raises(InvalidArgumentError, match="comma"):
        validate_spec(run(mounts=["/data/x,source=/"]))
    spec = run()
    spec.harness.env["DOCKER_HOST"] = "tcp://attacker:2375"
    with pytest.raises(InvalidArgumentError, match="DOCKER_HOST"):
        validate_spec(spec)


def test_image_references_follow_dockers_grammar() -> None:
    digest = "sha256:" + "a" * 64
    good = ["python:3.11-slim", "ghcr.io/org/img:tag", "localhost:5000/a", f"registry.example.com:443/a/b@{digest}"]
    good += ["ubuntu", digest, "[::1]:5000/x:y", "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"]
    for reference in good:
        assert check_image(reference) == reference
    for bad in ("UBUNTU", "a:b:c", "", "-x", "--privileged", "a b", "a,b", "a=b", "a/-b", "a\n", "x" * 600):
        with pytest.raises(InvalidArgumentError, match="image reference"):
            check_image(bad)
