"""Helpers of the attention tests: random pre-order forests and their dense ancestor masks (the reference)."""

from __future__ import annotations

import random

import torch


def random_forest(size: int, seed: int) -> list[int]:
    """Parents of a random pre-order forest: each token hangs under some node of the current root path."""
    rng = random.Random(seed)
    parents, path = [], []
    for token in range(size):
        if path and rng.random() < 0.9:
            del path[rng.randrange(len(path)) + 1 :]
            parents.append(path[-1])
        else:
            path, parents = [], [*parents, -1]
        path.append(token)
    return parents


def dense_mask(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: query q sees key k exactly when k is q or one of its ancestors."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for query in range(len(parents)):
        node = query
        while node >= 0:
            mask[query, node] = True
            node = parents[node]
    return mask
