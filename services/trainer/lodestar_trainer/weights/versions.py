"""The version a starting trainer pushes its weights as, from what the replicas serve and who published it.

A trainer starts (afresh, or `--resume` of a checkpoint at policy version v), or waits for groups, while the
replicas may serve other versions (restarted ones serve their base model), and a replica refuses any version
not newer than the one it serves. Each replica says which
version it serves and who published it (GetModelInfo `policy_version` and `policy_writer`: the `writer` of
the push, a trainer's run id); the trainer's own pushes carry its run id. `start_version` decides:

- A replica serves v or newer (it would refuse v), and every such replica's version was published by this
  run: the trainer died after pushing versions its checkpoint lacks, or mid-push (the replicas on two
  versions), or before its first checkpoint. Its weights go out as the newest served version + 1 and it goes
  on numbering from there. The versions between v and that newest one are superseded: the resumed run's
  steps continue from the checkpoint's weights, so none of them has those versions' weights.
- Every replica serves v or older, some older (a replica restarted): the weights go out as v.
- A replica ahead whose version another writer published (another trainer, a stale run, a push that named no
  writer, or a replica from before the writer existed): nothing is pushed past it. When no replica ahead is
  this run's, the trainer goes on as it did before writers were recorded: its push is refused by that replica,
  whose reason names the other writer (inference's `check_newer`), and the trainer is FAILED with it. When
  this run's versions and another writer's are both ahead, `ForeignWriterError` names the other writer.
- Otherwise (every replica serves exactly v, or a fresh trainer meets fresh replicas): nothing is pushed.
"""

from __future__ import annotations

from collections.abc import Mapping

from lodestar.errors import FailedPreconditionError
from lodestar_trainer.weights.publish import ServedVersion


class ForeignWriterError(FailedPreconditionError):
    """A replica serves a newer version that another writer published: the trainer does not push past it."""


def start_version(version: int, served: Mapping[str, ServedVersion], writer: str) -> int | None:
    """The version to push the trainer's weights (at `version`) as, before its first step or while it waits for
    groups; None for no push;
    `served`: each answering replica's version and writer; `writer`: the identity the trainer's pushes carry
    (its run id; empty: none, so no served version is its own). Raises ForeignWriterError (see the module
    docstring)."""
    ahead = {target: s for target, s in served.items() if s.version >= version and s.version > 0}
    foreign = {target: s for target, s in ahead.items() if not writer or s.writer != writer}
    behind = any(s.version < version for s in served.values())
    if ahead and not foreign:
        newest = max(s.version for s in ahead.values())
        return newest + 1 if newest > version or behind else None
    if foreign and len(foreign) < len(ahead):
        target, other = max(foreign.items(), key=lambda item: item[1].version)
        raise ForeignWriterError(
            f"inference at {target} serves policy version {other.version} published by "
            f"{_named(other.writer)}, not by this run ({writer!r}), while other replicas serve this run's "
            f"versions past its policy version {version}: the trainer does not push past another writer's "
            "versions (stop that writer, or restart the replica)"
        )
    return version if behind else None


def _named(writer: str) -> str:
    return f"writer {writer!r}" if writer else "an unnamed writer"
