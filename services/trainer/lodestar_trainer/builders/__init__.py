"""Builders: a group's samples (their CallRecords) -> training sequences. Pure modules, no torch.

`build_sequences(kind, samples)` is called once per group. Whatever the builder, every sampled token of
every call is exactly one loss target (see lodestar_trainer/data/batch.py), so the builders differ only in the
tokens they compute: `per_request` (each call alone), `prefix_merging` (a session's calls that extend each
other become one sequence) and `tree` (a prefix tree over the whole group). Bad records raise ValueError
naming the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from lodestar_trainer.builders import per_request, prefix_merging, tree
from lodestar_trainer.data.batch import BuildResult, Sample


class BuilderKind(StrEnum):
    PER_REQUEST = "per_request"
    PREFIX_MERGING = "prefix_merging"
    TREE = "tree"


_BUILDERS: dict[BuilderKind, Callable[[Sequence[Sample]], BuildResult]] = {
    BuilderKind.PER_REQUEST: per_request.build,
    BuilderKind.PREFIX_MERGING: prefix_merging.build,
    BuilderKind.TREE: tree.build,
}


def build_sequences(kind: BuilderKind, samples: Sequence[Sample]) -> BuildResult:
    """Training sequences for the samples of one group. Raises ValueError on an empty group or a bad call."""
    if not samples:
        raise ValueError("cannot build sequences from an empty group")
    return _BUILDERS[BuilderKind(kind)](samples)
