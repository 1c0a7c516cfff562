"""The runtime interface without a Docker daemon: choosing a backend per assignment, the docker
runtime's pure parts (its `docker run` argv, limits and options, PATH and path translation, the node
install it mounts, cgroup counters), and the private directories on a size-limited tmpfs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Launcher, RunDirs
from lodestar_gateway.node.harnesses.base import DEFAULT_BIN_DIR, REPO_ROOT
from lodestar_gateway.node.runtimes import (
    DockerBackend,
    DockerRuntime,
    HostBackend,
    HostRuntime,
    Runtimes,
    resolved_spec,
)
from lodestar_gateway.node.runtimes.base import mounts_under, remove_dir, stage_dirs
from lodestar_gateway.node.runtimes.docker_cli import DockerCli
from lodestar_gateway.node.runtimes.docker_spec import (
    NODE_BIN,
    SESSION_UID,
    cgroup_counters,
    container_path,
    limits_argv,
    node_install,
    options_of,
    run_argv,
    session_user,
)

FIXED = Path("/tmp/lodestar-session")


def _assignment(runtime: rollout_pb2.RuntimeSpec | None = None, image: str = "") -> rollout_pb2.SessionAssignment:
    message = rollout_pb2.SessionAssignment(
        session_id="s1", attempt=2, run_id="r1", task=rollout_pb2.Task(task_id="t", files={"a.txt": "A"}, image=image)
    )
    if runtime is not None:
        message.runtime.CopyFrom(runtime)
    return message


class RecordingBackend:
    kind = "docker"

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, str], rollout_pb2.RuntimeSpec | None, dict[str, str]]] = []

    async def create(
        self,
        name: str,
        files: Mapping[str, str],
        spec: rollout_pb2.RuntimeSpec | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> HostRuntime:
        self.created.append((name, dict(files), spec, dict(labels or {})))
        raise FailedPreconditionError("recorded")

    async def remove_leftovers(self) -> int:
        return 3


async def test_runtimes_pick_the_backend_of_the_assignment_kind(tmp_path: Path):
    docker = RecordingBackend()
    runtimes = Runtimes({"host": HostBackend(tmp_path / "sessions", Launcher()), "docker": docker})

    host = await runtimes.create("s1-a2", _assignment())
    assert host.kind == "host"
    assert (host.real.workdir / "a.txt").read_text() == "A"
    await host.cleanup()
    with pytest.raises(FailedPreconditionError, match="recorded"):
        await runtimes.create("s1-a2", _assignment(rollout_pb2.RuntimeSpec(kind="docker", image="run:img"), "task:img"))
    name, files, spec, labels = docker.created[0]
    assert (name, files) == ("s1-a2", {"a.txt": "A"})
    assert spec is not None
    assert spec.image == "task:img", "the task's image wins over the run's"
    assert labels == {"session": "s1", "attempt": "2", "run": "r1"}
    with pytest.raises(FailedPreconditionError, match="no 'podman' runtime"):
        await runtimes.create("x", _assignment(rollout_pb2.RuntimeSpec(kind="podman")))
    assert await runtimes.remove_leftovers() == 3


def test_resolved_spec_defaults_to_host_and_keeps_the_run_image():
    assert resolved_spec(_assignment()).kind == "host"
    assert resolved_spec(_assignment(rollout_pb2.RuntimeSpec(kind="docker", image="run:img"))).image == "run:img"


def test_docker_run_argv_isolates_limits_labels_and_mounts_read_only():
    spec = rollout_pb2.RuntimeSpec(kind="docker", image="img:1", cpus=1.5, memory_bytes=1 << 30, pids_limit=100)
    argv = run_argv(
        "lodestar-s1-a1-abc", spec, root=Path("/data/sessions/s1-a1"), fixed_root=FIXED,
        mounted=[Path("/opt/harnesses")], node=Path("/usr/bin/node"), labels={"session": "s1", "node": "n1"},
    )  # fmt: skip
    joined = " ".join(argv)
    for expected in ("--network none", "--pull never", "--init", "--cpus 1.5", f"--memory {1 << 30}",
                     f"--memory-swap {1 << 30}", "--pids-limit 100", "--label lodestar.session=s1",
                     "--label lodestar.node=n1", "type=bind,source=/data/sessions/s1-a1,target=/tmp/lodestar-session",
                     "type=bind,source=/opt/harnesses,target=/opt/harnesses,readonly",
                     f"type=bind,source=/usr/bin/node,target={NODE_BIN}/node,readonly"):  # fmt: skip
        assert expected in joined
    assert argv[-5:] == ["--entrypoint", "sleep", "--", "img:1", "infinity"]
    assert limits_argv(rollout_pb2.RuntimeSpec(kind="docker")) == [], "0 means no limit"


def test_session_containers_never_run_as_root():
    args: dict[str, Any] = {"root": Path("/s/a1"), "fixed_root": FIXED, "node": None, "labels": {}}
    argv = run_argv("c", rollout_pb2.RuntimeSpec(kind="docker", image="i"), mounted=[], **args)
    joined = " ".join(argv)
    assert f"--user {SESSION_UID}:{SESSION_UID}" in joined
    assert "--cap-drop ALL" in joined
    assert "--security-opt no-new-privileges" in joined
    assert "--user 1234:99" in " ".join(
        run_argv("c", rollout_pb2.RuntimeSpec(image="i"), mounted=[], user=(1234, 99), **args)
    )
    with pytest.raises(ValueError, match="never runs as root"):
        run_argv("c", rollout_pb2.RuntimeSpec(), mounted=[], user=(0, 0), **args)
    assert session_user(euid=0) == (SESSION_UID, SESSION_UID)
    assert session_user(euid=1000) == (os.getuid(), os.getgid())
    with pytest.raises(InvalidArgumentError, match="never run as root"):
        DockerBackend(Path("/tmp/unused"), node_id="n", reaper=False, user=(0, 0))


def test_a_node_install_below_root_gets_a_traversable_root():
    args: dict[str, Any] = {"root": Path("/s/a1"), "fixed_root": FIXED, "node": None, "labels": {}}
    pyenv = [Path("/root/.pyenv/versions/3.11.7"), Path("/opt/venv")]
    masked = " ".join(run_argv("c", rollout_pb2.RuntimeSpec(image="i"), mounted=pyenv, root_mask=Path("/m"), **args))
    assert "type=bind,source=/m,target=/root " in masked
    plain = " ".join(
        run_argv("c", rollout_pb2.RuntimeSpec(image="i"), mounted=[Path("/opt/venv")], root_mask=Path("/m"), **args)
    )
    assert "target=/root " not in plain


def test_docker_options_are_checked():
    spec = rollout_pb2.RuntimeSpec(kind="docker", image="i")
    assert options_of(spec) == ([], "score")
    spec.options.CopyFrom(struct_pb2.Struct())
    spec.options.update({"mounts": ["/data"], "on_limit": "infra"})
    assert options_of(spec) == (["/data"], "infra")
    for bad in ({"on_limit": "ignore"}, {"mounts": ["data"]}, {"network": "host"}):
        spec.options.Clear()
        spec.options.update(bad)
        with pytest.raises(InvalidArgumentError):
            options_of(spec)


def test_container_path_keeps_mounted_dirs_then_node_then_the_image_path():
    mounted = [Path("/work/main/.harnesses"), Path("/work/main/.venv")]
    host_path = "/work/main/.venv/bin:/work/main/.harnesses/node_modules/.bin:/usr/bin:/opt/host-only/bin:/bin"
    path = container_path(host_path, mounted, "/opt/conda/bin:/usr/bin:/bin")
    assert path.split(":") == [
        "/work/main/.venv/bin", "/work/main/.harnesses/node_modules/.bin", str(NODE_BIN), "/opt/conda/bin", "/usr/bin",
        "/bin",
    ]  # fmt: skip
    assert container_path("/usr/bin", mounted, "").endswith(
        ":/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
    )


def test_node_install_mounts_harnesses_python_and_code_without_nesting():
    paths = node_install(DEFAULT_BIN_DIR, ["/etc"])
    assert Path(sys.prefix).resolve() in paths
    assert (REPO_ROOT / "services").resolve() in paths
    assert Path("/etc") in paths
    for path in paths:
        assert not any(path != other and path.is_relative_to(other) for other in paths), path
    if DEFAULT_BIN_DIR.is_dir():
        assert DEFAULT_BIN_DIR.resolve().parent.parent in paths


def test_docker_translate_rewrites_paths_path_and_node(tmp_path: Path):
    real = RunDirs.under(tmp_path / "s1-a1")
    runtime = DockerRuntime(
        root=tmp_path / "s1-a1", real=real, visible=RunDirs(FIXED / "home", FIXED / "tmp", FIXED / "work"),
        container="c", image="i", spec=rollout_pb2.RuntimeSpec(kind="docker", image="i"),
        mounted=[Path(sys.prefix).resolve()], image_path="/usr/local/bin:/usr/bin:/bin", on_limit="score",
        cli=DockerCli(), pid=0,
    )  # fmt: skip
    invocation = Command(["{python}", "{workdir}/x.py"]).prepare(
        real, GatewayEndpoint("http://127.0.0.1:9", "k", "m"), "p"
    )
    translated = runtime.translate(invocation)
    assert translated.argv[1] == "/tmp/lodestar-session/work/x.py"
    assert translated.cwd == FIXED / "work"
    assert translated.env["HOME"] == "/tmp/lodestar-session/home"
    assert translated.env["PATH"].split(":")[1] == str(NODE_BIN)
    assert translated.env["PATH"].endswith(":/usr/local/bin:/usr/bin:/bin")
    assert all(str(tmp_path) not in value for value in translated.env.values())


def test_cgroup_counters_read_v1_and_v2_files(tmp_path: Path):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("8:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n")
    (root / "pids" / "docker" / "abc").mkdir(parents=True)
    (root / "pids" / "docker" / "abc" / "pids.events").write_text("max 12\n")
    (root / "memory" / "docker" / "abc").mkdir(parents=True)
    (root / "memory" / "docker" / "abc" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    assert cgroup_counters(7, proc=proc, root=root) == {"oom_kill": 2, "pids_max": 12}
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("0::/system.slice/docker-abc.scope\n")
    (root / "system.slice" / "docker-abc.scope").mkdir(parents=True)
    (root / "system.slice" / "docker-abc.scope" / "memory.events").write_text(
        "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"
    )
    assert cgroup_counters(8, proc=proc, root=root) == {"oom_kill": 1, "pids_max": 0}
    assert cgroup_counters(99, proc=proc, root=root) == {"oom_kill": 0, "pids_max": 0}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_disk_limit_is_a_tmpfs_of_that_size_removed_with_the_session(tmp_path: Path):
    root = tmp_path / "s1-a1"
    dirs = stage_dirs(root, {"src/a.py": "x = 1\n"}, tmpfs_bytes=4 << 20)
    assert mounts_under(root) == [root.resolve()]
    stat = os.statvfs(root)
    assert stat.f_blocks * stat.f_frsize == 4 << 20
    assert (dirs.workdir / "src" / "a.py").read_text() == "x = 1\n"
    with pytest.raises(OSError, match="No space left"):
        (dirs.workdir / "big").write_bytes(b"\0" * (5 << 20))

    remove_dir(root)

    assert not root.exists()
    assert mounts_under(root) == []


def test_task_files_must_stay_in_the_workspace(tmp_path: Path):
    for path in ("../x", "/etc/passwd", ""):
        with pytest.raises(InvalidArgumentError):
            stage_dirs(tmp_path / "s", {path: "x"})
