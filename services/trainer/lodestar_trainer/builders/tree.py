"""The `tree` builder: one prefix tree over every call of every session given, each shared prefix once.

It is given a whole step (data/sequences.py): the groups of a run share their harness's system prompt and
tools, and a group's samples share the task text too.

Every call's path (prompt ids + sampled ids) is inserted into a radix tree (edges hold runs of tokens and
split where paths diverge). The samples of a group share the system prompt, tools and task text, so the
whole group is usually one tree: its trunk is computed once, and sessions, sub-agent chains, compactions
and retries are branches. Linear chains (a call that extends the previous one) cost nothing extra: they
are one path.

Layout: the tree is flattened in DFS pre-order, so every subtree is a contiguous run of tokens (the
forward pass relies on that: token k is an ancestor of token q exactly when k <= q < end of k's subtree).
A token's parent is the previous token of its path, its position id is its depth (the position the model
saw it at). Each call's sampled tokens become targets at the tree nodes on its path; two calls that
sampled the same tokens after the same prompt (e.g. identical first replies in two samples) share the
nodes and each contributes its own targets. One TrainingSequence per distinct first token (normally one).

Stats: `merges` counts calls that reused tokens already in the tree, `breaks` calls that started a new
root although the group already had one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lodestar.v1 import common_pb2
from lodestar_trainer.builders.per_request import add_targets, call_tokens
from lodestar_trainer.data.batch import BuildResult, BuildStats, Sample, TrainingSequence, check_call

Tokens = npt.NDArray[np.int64]


@dataclass(eq=False)
class _Node:
    tokens: Tokens
    depth: int
    """Depth of the first token of this edge (its position id)."""
    children: dict[int, _Node] = field(default_factory=dict)
    start: int = -1
    """Layout index of the first token, set when the tree is flattened."""


def _common_prefix(a: Tokens, b: Tokens) -> int:
    size = min(len(a), len(b))
    differ = np.flatnonzero(a[:size] != b[:size])
    return int(differ[0]) if len(differ) else size


def _split(node: _Node, at: int) -> _Node:
    """Cut `node`'s edge after `at` tokens; return the new upper node (which replaces it in its parent)."""
    lower = _Node(node.tokens[at:], node.depth + at, node.children)
    node.tokens, node.children = node.tokens[:at], {int(lower.tokens[0]): lower}
    return node


def _insert(root: _Node, path: Tokens) -> bool:
    """Insert `path`; True when it shared at least its first token with the tree."""
    node, pos = root, 0
    shared = int(path[0]) in root.children
    while pos < len(path):
        child = node.children.get(int(path[pos]))
        if child is None:
            node.children[int(path[pos])] = _Node(path[pos:], pos)
            return shared
        common = _common_prefix(child.tokens, path[pos:])
        if common < len(child.tokens):
            _split(child, common)
        node, pos = child, pos + common
    return shared


def _nodes_on(root: _Node, path: Tokens) -> list[_Node]:
    """The nodes a fully inserted path runs through, root-side first."""
    nodes, node, pos = [], root, 0
    while pos < len(path):
        node = node.children[int(path[pos])]
        nodes.append(node)
        pos += len(node.tokens)
    return nodes


def _flatten(top: _Node) -> TrainingSequence:
    """Lay the subtree under `top` out in DFS pre-order (sets every node's `start`)."""
    sequence = TrainingSequence(token_ids=[], parents=[], position_ids=[])
    stack: list[tuple[_Node, int]] = [(top, -1)]
    while stack:
        node, parent = stack.pop()
        node.start = len(sequence.token_ids)
        size = len(node.tokens)
        sequence.token_ids.extend(node.tokens.tolist())
        sequence.parents.append(parent)
        sequence.parents.extend(range(node.start, node.start + size - 1))
        sequence.position_ids.extend(range(node.depth, node.depth + size))
        last = node.start + size - 1
        stack.extend((child, last) for child in reversed(node.children.values()))
    return sequence


def build(samples: Sequence[Sample]) -> BuildResult:
    root = _Node(np.empty(0, dtype=np.int64), 0)
    calls: list[tuple[Sample, common_pb2.CallRecord, Tokens]] = []
    merges = breaks = 0
    for sample in samples:
        for call in sorted(sample.calls, key=lambda record: record.sequence):
            check_call(call)
            path = np.array([*call.prompt_token_ids, *call.completion_token_ids], dtype=np.int64)
            had_roots = bool(root.children)
            if _insert(root, path):
                merges += 1
            elif had_roots:
                breaks += 1
            calls.append((sample, call, path))
    sequences = {first: _flatten(top) for first, top in root.children.items()}
    for sample, call, path in calls:
        sequence, prompt_len = sequences[int(path[0])], len(call.prompt_token_ids)
        for node in _nodes_on(root, path):
            lo, hi = max(prompt_len, node.depth), node.depth + len(node.tokens)
            if hi > lo:
                tokens = range(node.start + lo - node.depth, node.start + hi - node.depth)
                add_targets(sequence, tokens, sample, call, lo - prompt_len)
    built = list(sequences.values())
    stats = BuildStats(
        calls=len(calls),
        sequences=len(built),
        call_tokens=call_tokens(samples),
        sequence_tokens=sum(len(sequence) for sequence in built),
        merges=merges,
        breaks=breaks,
    )
    return BuildResult(built, stats)
