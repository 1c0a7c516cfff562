"""RunSpec.runtime validation: an unknown kind, a docker run without an image for some task, bad docker
options (a mount of `/`, the docker socket or another host system path included) or a negative CPU limit
are INVALID_ARGUMENT at CreateRun; the assignment carries the runtime."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import struct_pb2

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_rollout import spec as specs
from tests.rollout.helpers import Rollout, make_spec


def _docker(image: str = "lodestar/session-base:dev", **options: object) -> rollout_pb2.RuntimeSpec:
    runtime = rollout_pb2.RuntimeSpec(kind="docker", image=image, cpus=1.5, memory_bytes=1 << 30, pids_limit=256)
    if options:
        runtime.options.CopyFrom(struct_pb2.Struct())
        runtime.options.update(options)
    return runtime


def test_host_docker_and_per_task_images_are_valid() -> None:
    specs.validate_spec(make_spec(tasks=2))  # no runtime: host
    specs.validate_spec(make_spec(tasks=2, runtime=rollout_pb2.RuntimeSpec(kind="host")))
    specs.validate_spec(make_spec(tasks=2, runtime=_docker(on_limit="infra", mounts=["/data/verifiers"])))
    per_task = make_spec(tasks=2, runtime=_docker(image=""))
    for task in per_task.tasks:
        task.image = f"lodestar/task-{task.task_id}:dev"
    specs.validate_spec(per_task)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        (rollout_pb2.RuntimeSpec(kind="podman"), "unknown runtime kind 'podman'"),
        (rollout_pb2.RuntimeSpec(kind="docker"), "runtime 'docker' needs an image"),
        (rollout_pb2.RuntimeSpec(kind="host", cpus=-1), "runtime.cpus"),
        (_docker(on_limit="ignore"), "on_limit"),
        (_docker(mounts=["relative/path"]), "mounts"),
        (_docker(network="host"), "unknown docker runtime option 'network'"),
        (_docker(mounts=["/"]), "docker runtime mount '/' is refused"),
        (_docker(mounts=["/var/run/docker.sock"]), "refused"),
        (_docker(mounts=["/run/docker.sock"]), "refused"),
        (_docker(mounts=["/srv/docker.sock"]), "no socket may be mounted"),
        (_docker(mounts=["/var/run"]), "refused"),
        (_docker(mounts=["/proc/1/root"]), "refused"),
        (_docker(mounts=["/etc"]), "refused"),
        (_docker(mounts=["/data/../etc"]), "normalized absolute path"),
        (_docker(mounts=["/data//x"]), "normalized absolute path"),
    ],
)
def test_bad_runtimes_are_refused_naming_the_problem(runtime: rollout_pb2.RuntimeSpec, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        specs.validate_spec(make_spec(tasks=2, runtime=runtime))


def test_docker_without_an_image_names_the_tasks_that_lack_one() -> None:
    spec = make_spec(tasks=3, runtime=_docker(image=""))
    spec.tasks[0].image = "lodestar/task:dev"
    with pytest.raises(InvalidArgumentError, match="task-1, task-2"):
        specs.validate_spec(spec)


async def test_create_run_refuses_a_bad_runtime(rollout: Rollout) -> None:
    for runtime in (
        rollout_pb2.RuntimeSpec(kind="vm"),
        rollout_pb2.RuntimeSpec(kind="docker"),
        _docker(mounts=["/"]),  # the host's root, or its docker socket: refused whatever a node allows
        _docker(mounts=["/data/verifiers", "/var/run/docker.sock"]),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rollout.create_run(make_spec(runtime=runtime))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "runtime" in (caught.value.details() or "")
