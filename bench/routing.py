"""Session affinity against round-robin: prefill tokens a pool of replicas computes for multi-turn sessions.

A simulation, not a measurement of an engine: it replays agent sessions (each call's prompt is the previous
call's prompt + its completion + the new tool output, as an agent harness sends them) over `--replicas`
replicas, each with a prefix cache of `--cache-tokens` tokens (LRU by session: the prompt of a session's
last call on that replica, the way vLLM's block-hashed prefix cache keeps a conversation's blocks), with
`--concurrent` sessions in flight at once. A call costs the prompt tokens its replica has not cached. The
router under test is the gateway's own (`services/gateway/lodestar_gateway/routing.py`, bounded load, sticky sessions);
round-robin and random place every call anew, as a plain Kubernetes Service would. Output: total prefill
tokens per policy, and the ratio to affinity.

    .venv/bin/python bench/routing.py [--sessions 400] [--replicas 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from lodestar_gateway.routing import AffinityRouter


@dataclass(frozen=True)
class Call:
    session: str
    prompt_tokens: int
    """Tokens of this call's prompt (all of it: the session so far)."""


def sessions(count: int, rng: random.Random) -> list[list[Call]]:
    """`count` agent sessions of 5-30 calls: a 2-6k token system prompt and task, then per call a completion
    of 50-400 tokens and a tool output of 100-3000 tokens appended."""
    out = []
    for index in range(count):
        name, tokens, calls = f"ses_{index:05d}", rng.randint(2000, 6000), []
        for _ in range(rng.randint(5, 30)):
            calls.append(Call(name, tokens))
            tokens += rng.randint(50, 400) + rng.randint(100, 3000)
        out.append(calls)
    return out


def interleaved(all_sessions: list[list[Call]], concurrent: int, rng: random.Random) -> Iterator[Call]:
    """The calls in the order a pool running `concurrent` sessions at once would send them."""
    waiting = list(all_sessions)
    running: list[Iterator[Call]] = []
    while waiting or running:
        while waiting and len(running) < concurrent:
            running.append(iter(waiting.pop(0)))
        current = rng.choice(running)
        call = next(current, None)
        if call is None:
            running.remove(current)
            continue
        yield call


class PrefixCache:
    """One replica's cache: for each session, the prompt length of its last call here (LRU over tokens)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[str, int] = OrderedDict()

    def prefill(self, call: Call) -> int:
        cached = self.held.pop(call.session, 0)
        self.held[call.session] = call.prompt_tokens
        while sum(self.held.values()) > self.capacity and len(self.held) > 1:
            self.held.popitem(last=False)
        return call.prompt_tokens - min(cached, call.prompt_tokens)


def replay(calls: list[Call], replicas: int, capacity: int, pick: Callable[[Call], int]) -> int:
    caches = [PrefixCache(capacity) for _ in range(replicas)]
    return sum(caches[pick(call)].prefill(call) for call in calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=48)
    parser.add_argument("--cache-tokens", type=int, default=1_000_000, help="prefix cache per replica")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    calls = list(interleaved(sessions(args.sessions, rng), args.concurrent, rng))
    names = [f"replica-{i}" for i in range(args.replicas)]

    router = AffinityRouter(names)
    index = {name: i for i, name in enumerate(names)}

    def affinity(call: Call) -> int:
        replica = router.pick(call.session)
        assert replica is not None
        return index[replica]

    turn = itertools.count()
    picker = random.Random(args.seed + 1)
    results = {
        "affinity (gateway router)": replay(calls, args.replicas, args.cache_tokens, affinity),
        "round-robin": replay(calls, args.replicas, args.cache_tokens, lambda call: next(turn) % args.replicas),
        "random": replay(calls, args.replicas, args.cache_tokens, lambda call: picker.randrange(args.replicas)),
    }
    total = sum(call.prompt_tokens for call in calls)
    base = results["affinity (gateway router)"]
    table = Table(title=f"{len(calls)} calls of {args.sessions} sessions over {args.replicas} replicas "
                  f"({args.concurrent} at once, {args.cache_tokens:,} cached tokens each)")  # fmt: skip
    for column in ("routing", "prefill tokens", "share of prompt tokens", "x affinity"):
        table.add_column(column, justify="left" if column == "routing" else "right")
    for name, prefill in results.items():
        table.add_row(name, f"{prefill:,}", f"{prefill / total:.1%}", f"{prefill / base:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
