"""Session runtimes, one module per kind (`host.py`, `docker.py`) behind the interface of `base.py`, and
`Runtimes`: the node's backends, chosen per attempt by `SessionAssignment.runtime.kind` (empty: host).
See docs/runtimes.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from lodestar.errors import FailedPreconditionError
from lodestar.kinds import DEFAULT_RUNTIME_KIND
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.runtimes.base import RuntimeBackend, SessionRuntime
from lodestar_gateway.node.runtimes.docker import DockerBackend, DockerRuntime
from lodestar_gateway.node.runtimes.host import HostBackend, HostRuntime


def resolved_spec(assignment: rollout_pb2.SessionAssignment) -> rollout_pb2.RuntimeSpec:
    """The assignment's runtime with its kind defaulted to "host" and the task's image (if any) applied."""
    spec = rollout_pb2.RuntimeSpec()
    spec.CopyFrom(assignment.runtime)
    spec.kind = spec.kind or DEFAULT_RUNTIME_KIND
    if assignment.task.image:
        spec.image = assignment.task.image
    return spec


class Runtimes:
    """The runtime backends of one node, by kind."""

    def __init__(self, backends: Mapping[str, RuntimeBackend]) -> None:
        self.backends = dict(backends)

    async def create(self, name: str, assignment: rollout_pb2.SessionAssignment) -> SessionRuntime:
        spec = resolved_spec(assignment)
        backend = self.backends.get(spec.kind)
        if backend is None:
            raise FailedPreconditionError(
                f"this node has no {spec.kind!r} runtime (it runs: {', '.join(self.backends)})"
            )
        labels = {"session": assignment.session_id, "attempt": str(assignment.attempt), "run": assignment.run_id}
        return await backend.create(name, dict(assignment.task.files), spec, labels)

    async def remove_leftovers(self) -> int:
        """What earlier processes left behind: containers first, then the session directories."""
        ordered = sorted(self.backends.values(), key=lambda backend: backend.kind == "host")
        return sum([await backend.remove_leftovers() for backend in ordered])

    async def close(self) -> None:
        await asyncio.gather(
            *(backend.close() for backend in self.backends.values() if isinstance(backend, DockerBackend))
        )


__all__ = [
    "DockerBackend",
    "DockerRuntime",
    "HostBackend",
    "HostRuntime",
    "RuntimeBackend",
    "Runtimes",
    "SessionRuntime",
    "resolved_spec",
]
