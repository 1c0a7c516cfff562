"""Splitting: a training sequence longer than the micro-batch budget -> parts that fit, same loss, same gradient.

A token's hidden state depends only on its ancestors (tree attention, positions = depths), and a target's
logprob is read at its parent. So any set of tokens closed under "parent of" computes, for every token in it,
exactly the hidden states of the whole sequence. A part is such a set, laid out in the sequence's own order
(a pre-order restricted to an ancestor-closed set is still a pre-order), and owns a share of the targets:
every target is in exactly one part, and the other tokens of a part are context (recomputed, no loss). The
loss is a sum over targets with step-level weights (loss.py counts targets, not tokens or sequences), so
the sum over parts is the unsplit loss as a function of the weights, and its gradient the unsplit gradient.

How: walk the tokens some target needs (the targets and their ancestors) in layout order and cut greedily.
A part that starts at token s holds s's ancestors as context plus the needed tokens from s on while
depth(s) + count <= budget: in pre-order, every ancestor of a later token that lies before s is an
ancestor of s, so that is all the context the part needs. When a part fills up inside a branch, the
branch's head moves on to the next part if that part still fits (`_cut`): its context is then the path to
the branch point, not to the cut, so for a group's tree (a trunk shared by the samples, their branches)
a part recomputes the trunk and not the head of the branch it cuts into.

The limit of recompute: a part holds the whole path of each of its targets, so a target deeper than the
budget (its path from the root is longer than `budget` tokens) cannot go into a part that fits. Such
targets are not an error (a long linear session would then never train): below the last ancestor whose
path still fits (the anchor), everything goes into ONE part over the budget, with the targets on the
anchor's path. For a linear chain that is the whole chain. Its forward then runs in chunks of the budget
with KV reuse (pack.py marks it, step/forward.py runs it): the same gradient, no pass over the budget's
queries. Tokens no target needs (a trailing tool result) are dropped from split sequences.

Pure: lists in, lists out, no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lodestar_trainer.data.batch import TrainingSequence


@dataclass(frozen=True)
class SplitStats:
    """What splitting did to a step's sequences (the step metrics `split_*`, `recomputed_tokens`)."""

    split_sequences: int = 0
    """Sequences longer than the budget that became two or more parts."""
    parts: int = 0
    """Parts those sequences became."""
    recomputed_tokens: int = 0
    """Tokens computed more than once (context recomputed in a later part): the cost of splitting."""
    over_budget_parts: int = 0
    """Parts longer than the budget because a target's path from the root is (module docstring)."""
    longest_part: int = 0
    """Tokens in the longest part or unsplit sequence."""

    def __add__(self, other: SplitStats) -> SplitStats:
        return SplitStats(
            split_sequences=self.split_sequences + other.split_sequences,
            parts=self.parts + other.parts,
            recomputed_tokens=self.recomputed_tokens + other.recomputed_tokens,
            over_budget_parts=self.over_budget_parts + other.over_budget_parts,
            longest_part=max(self.longest_part, other.longest_part),
        )


def _depths(parents: Sequence[int]) -> list[int]:
    depths = [0] * len(parents)
    for token, parent in enumerate(parents):
        if parent >= token:
            raise ValueError(f"token {token}: parent {parent} does not come before it (not a pre-order layout)")
        depths[token] = depths[parent] + 1 if parent >= 0 else 0
    return depths


def _path(parents: Sequence[int], token: int) -> list[int]:
    """`token` and its ancestors, root last."""
    path = []
    while token >= 0:
        path.append(token)
        token = parents[token]
    return path


def _closure(parents: Sequence[int], tokens: Iterable[int]) -> set[int]:
    """`tokens` and all their ancestors."""
    closed: set[int] = set()
    for token in tokens:
        while token >= 0 and token not in closed:
            closed.add(token)
            token = parents[token]
    return closed


def _part(sequence: TrainingSequence, tokens: set[int], targets: Sequence[int]) -> TrainingSequence:
    """The ancestor-closed `tokens` in layout order, owning the targets whose indices are `targets`."""
    kept = sorted(tokens)
    index = {old: new for new, old in enumerate(kept)}
    part = TrainingSequence(
        token_ids=[sequence.token_ids[old] for old in kept],
        parents=[index[sequence.parents[old]] if sequence.parents[old] >= 0 else -1 for old in kept],
        position_ids=[sequence.position_ids[old] for old in kept],
    )
    count = len(sequence.target_tokens)
    for target in targets:
        part.target_tokens.append(index[sequence.target_tokens[target]])
        part.target_samples.append(sequence.target_samples[target])
        part.behaviour_logprobs.append(sequence.behaviour_logprobs[target])
        part.advantages.append(sequence.advantages[target])
        if len(sequence.temperatures) == count:
            part.temperatures.append(sequence.temperatures[target])
        if len(sequence.versions) == count:
            part.versions.append(sequence.versions[target])
    return part


def _over_budget_parts(
    sequence: TrainingSequence, depths: list[int], budget: int
) -> tuple[list[tuple[set[int], list[int]]], set[int]]:
    """(tokens, targets) of each over-budget part, one per anchor (module docstring); the targets they own."""
    parents, by_anchor, anchor_of = sequence.parents, dict[int, list[int]](), dict[int, int]()
    for token, depth in enumerate(depths):  # the ancestor at depth budget - 1 of every deeper token
        if depth >= budget - 1:
            anchor_of[token] = token if depth == budget - 1 else anchor_of[parents[token]]
    for target, token in enumerate(sequence.target_tokens):
        if depths[token] >= budget:
            by_anchor.setdefault(anchor_of[token], []).append(target)
    owned: set[int] = set()
    parts: list[tuple[set[int], list[int]]] = []
    for anchor in sorted(by_anchor):
        on_path = set(_path(parents, anchor))
        targets = [t for t, token in enumerate(sequence.target_tokens) if token in on_path and t not in owned]
        targets = sorted(set(targets) | set(by_anchor[anchor]))
        owned.update(targets)
        parts.append((_closure(parents, (sequence.target_tokens[t] for t in targets)) | on_path, targets))
    return parts, owned


def _split(sequence: TrainingSequence, budget: int) -> list[tuple[set[int], list[int]]]:
    """(tokens, owned target indices) of each part of a sequence longer than `budget`."""
    depths = _depths(sequence.parents)
    parts, owned = _over_budget_parts(sequence, depths, budget)
    targets_at: dict[int, list[int]] = {}
    for target, token in enumerate(sequence.target_tokens):
        if target not in owned:
            targets_at.setdefault(token, []).append(target)
    runs: list[list[int]] = []  # the needed tokens of each part from its first on (its context: their ancestors)
    for token in sorted(_closure(sequence.parents, targets_at)):
        if runs and depths[runs[-1][0]] + len(runs[-1]) < budget:
            runs[-1].append(token)
        else:
            runs.append([*_cut(runs[-1] if runs else [], token, sequence.parents, depths, budget), token])
    greedy = [
        (set(_path(sequence.parents, run[0])) | set(run), [t for x in run for t in targets_at.get(x, ())])
        for run in runs
    ]
    return [part for part in greedy if part[1]] + parts


def _cut(run: list[int], token: int, parents: Sequence[int], depths: list[int], budget: int) -> list[int]:
    """The tail of the full `run` that moves to the part `token` starts (removed from `run`): from the shallowest
    ancestor of `token` in the run (not its first token) such that the new part still fits. Its context is then
    that ancestor's path instead of `token`'s, which saves recomputing the head of the branch the cut falls in."""
    best = len(run)
    for ancestor in _path(parents, token)[1:]:
        at = bisect.bisect_left(run, ancestor)
        if at == 0 or at == len(run) or run[at] != ancestor:
            break  # before the run: every further ancestor is too
        if depths[ancestor] + len(run) - at + 1 > budget:
            break  # a shallower ancestor moves more tokens for one less of context: it does not fit either
        best = at
    tail = run[best:]
    del run[best:]
    return tail


def split_sequence(sequence: TrainingSequence, budget: int) -> list[TrainingSequence]:
    """`sequence` itself when it fits in `budget` tokens, else its parts (module docstring): every target in
    exactly one part, each part at most `budget` tokens unless it holds a target deeper than that.

    Raises ValueError for a non-positive budget or a layout whose parents do not come first."""
    return split_to_budget([sequence], budget)[0]


def split_to_budget(sequences: Sequence[TrainingSequence], budget: int) -> tuple[list[TrainingSequence], SplitStats]:
    """Every sequence that fits as it is, every longer one as its parts (`split_sequence`), and what it cost."""
    if budget <= 0:
        raise ValueError(f"token budget must be positive, got {budget}")
    out: list[TrainingSequence] = []
    stats = SplitStats()
    for sequence in sequences:
        if len(sequence) <= budget:
            out.append(sequence)
            stats += SplitStats(longest_part=len(sequence))
            continue
        parts = _split(sequence, budget)
        out.extend(_part(sequence, tokens, targets) for tokens, targets in parts)
        sizes = [len(tokens) for tokens, _ in parts]
        several = len(parts) > 1
        stats += SplitStats(
            split_sequences=int(several),
            parts=len(parts) if several else 0,
            recomputed_tokens=sum(sizes) - len(set().union(*(tokens for tokens, _ in parts))),
            over_budget_parts=sum(size > budget for size in sizes),
            longest_part=max(sizes, default=0),
        )
    return out, stats
