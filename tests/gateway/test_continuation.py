"""The continuation matcher as a pure unit (no HTTP, no inference): semantic message keys, the longest
covered prefix, FIRST / CONTINUED / BRANCH / DRIFT, and lookups whose cost does not grow with the calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway import continuation
from lodestar_gateway.continuation import (
    ChainIndex,
    ChainLink,
    ChainMatch,
    MessageKey,
    context_key,
    message_key,
    message_keys,
)

ROLES = [common_pb2.ROLE_SYSTEM, common_pb2.ROLE_DEVELOPER, common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT] * 2
TOOLS = context_key([common_pb2.ToolDefinition(name="bash", parameters_json="{}")])
NO_TOOLS = context_key([])


def msg(role: str, text: str = "", *, reasoning: str = "", call: str | None = None) -> common_pb2.ChatMessage:
    message = common_pb2.ChatMessage(role=common_pb2.Role.Value(f"ROLE_{role.upper()}"))
    if reasoning:
        message.content.add(reasoning=common_pb2.ReasoningPart(text=reasoning))
    if text:
        message.content.add(text=common_pb2.TextPart(text=text))
    if call is not None:
        message.tool_calls.add(id="call_x", name="bash", arguments_json=call)
    return message


def link(sequence: int, keys: list[MessageKey], context: bytes = TOOLS) -> ChainLink:
    return ChainLink(sequence, context, keys, inference_pb2.Continuation(token_ids=[sequence], message_count=len(keys)))


def start_name(value: int) -> str:
    return common_pb2.ChainStart.Name(value).removeprefix("CHAIN_START_")


def test_first_continued_and_longest_prefix() -> None:
    index = ChainIndex()
    base = [msg("system", "s"), msg("user", "task")]
    first = index.find("s1", TOOLS, message_keys(base), roles=ROLES)
    assert (first.link, start_name(first.start)) == (None, "FIRST")
    turn0 = [*base, msg("assistant", "ok", call='{"command": "ls"}')]
    index.add("s1", link(0, message_keys(turn0)))
    turn1 = [*turn0, msg("tool", "files"), msg("assistant", "done")]
    index.add("s1", link(1, message_keys(turn1)))
    # Re-serialized arguments, whitespace and tool-call ids do not matter; the longest covered prefix wins.
    resent = [*base, msg("assistant", " ok ", call='{"command":"ls"}'), msg("tool", "files"), msg("assistant", "done")]
    found = index.find("s1", TOOLS, message_keys([*resent, msg("user", "more")]), roles=ROLES)
    assert found.link is not None
    assert found.link.sequence == 1
    assert start_name(found.start) == "CONTINUED"
    found = index.find("s1", TOOLS, message_keys([*turn0, msg("tool", "other")]), roles=ROLES)
    assert found.link is not None
    assert found.link.sequence == 0


def test_reasoning_dropped_on_resend_matches_but_changed_reasoning_does_not() -> None:
    index = ChainIndex()
    turn = [msg("user", "q"), msg("assistant", "a", reasoning="because")]
    index.add("s", link(0, message_keys(turn)))
    dropped = index.find("s", TOOLS, message_keys([msg("user", "q"), msg("assistant", "a"), msg("user", "next")]))
    assert dropped.link is not None  # Gemini CLI drops earlier thought parts
    same = index.find("s", TOOLS, message_keys([*turn, msg("user", "next")]))
    assert same.link is not None
    changed = [msg("user", "q"), msg("assistant", "a", reasoning="other"), msg("user", "next")]
    miss = index.find("s", TOOLS, message_keys(changed))
    assert miss.link is None


def test_branch_and_drift_are_told_apart() -> None:
    index = ChainIndex()
    system = [msg("system", "s"), msg("developer", "d")]
    turn = [*system, msg("user", "task"), msg("assistant", "a1")]
    index.add("s", link(0, message_keys(turn)))
    # A compaction summary or a sub-agent: only the system messages are shared.
    branch = index.find("s", TOOLS, message_keys([*system, msg("user", "summary of earlier work")]), roles=ROLES)
    assert (start_name(branch.start), branch.first_difference, branch.closest_sequence) == ("BRANCH", 2, 0)
    # The same first turn again (a retry or a second sample): a branch too.
    retry = index.find("s", TOOLS, message_keys(turn[:3]), roles=ROLES)
    assert start_name(retry.start) == "BRANCH"
    # The model's answer came back altered: shared conversation, then a difference -> drift.
    drift = index.find("s", TOOLS, message_keys([*turn[:3], msg("assistant", "a1!"), msg("user", "x")]), roles=ROLES)
    assert (start_name(drift.start), drift.first_difference, drift.reason) == ("DRIFT", 3, "assistant message differs")
    # Same conversation, other tools (a compaction request without tools, a sub-agent) -> a branch.
    tools = index.find("s", NO_TOOLS, message_keys([*turn, msg("user", "x")]), roles=ROLES)
    assert (start_name(tools.start), tools.reason) == ("BRANCH", "tools differ")
    # The history replaced after the first user message (Codex after a compaction) -> a branch.
    after = index.find(
        "s", TOOLS, message_keys([*turn[:3], msg("user", "summary")]), roles=[*ROLES[:3], common_pb2.ROLE_USER]
    )
    assert (start_name(after.start), after.first_difference) == ("BRANCH", 3)


def test_latest_link_wins_on_ties_and_drop_forgets() -> None:
    index = ChainIndex()
    turn = message_keys([msg("user", "q"), msg("assistant", "a")])
    index.add("s", link(0, turn))
    index.add("s", link(1, turn))
    found = index.find("s", TOOLS, [*turn, *message_keys([msg("user", "n")])])
    assert found.link is not None
    assert found.link.sequence == 1
    index.drop("s")
    assert not index.has("s")
    assert len(index) == 0


@dataclass
class LookupWork:
    """What one `ChainIndex.find` did: stored links compared with the request, and prefix digests computed."""

    links_compared: int = 0
    digest_runs: int = 0


def _lookup_work(
    monkeypatch: pytest.MonkeyPatch, index: ChainIndex, session: str, keys: list[MessageKey]
) -> tuple[LookupWork, ChainMatch]:
    """Run one lookup with its two costly steps counted (the structural form of its cost: no timing)."""
    work = LookupWork()
    same_prefix, prefix_digests = continuation._same_prefix, continuation.prefix_digests

    def counted_same_prefix(request: Sequence[MessageKey], stored: list[MessageKey]) -> bool:
        work.links_compared += 1
        return same_prefix(request, stored)

    def counted_digests(keys: Sequence[MessageKey], start: int = 0, seed: bytes = b"") -> list[bytes]:
        work.digest_runs += 1
        return prefix_digests(keys, start, seed)

    with monkeypatch.context() as patch:
        patch.setattr(continuation, "_same_prefix", counted_same_prefix)
        patch.setattr(continuation, "prefix_digests", counted_digests)
        found = index.find(session, TOOLS, keys, roles=ROLES)
    return work, found


@pytest.mark.slow
def test_lookup_cost_does_not_grow_with_the_calls_of_a_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 calls in one session: 20 sub-agent chains of 100 turns each. A lookup at the end compares the
    request with the links that end in the same message only (one per chain here: 20), not with every earlier
    call (the old scan grew with them), and digests nothing."""
    crowded, alone = ChainIndex(), ChainIndex()
    chains = [[msg("system", "s"), msg("user", f"task {c}")] for c in range(20)]
    sequence = 0
    for turn in range(100):
        for c, chain in enumerate(chains):
            chain.append(msg("assistant", f"step {turn}", call=f'{{"n": {turn}}}'))
            keys = message_keys(chain)
            crowded.add("s", link(sequence, keys))
            if c == 0:
                alone.add("s", link(sequence, keys))
            chain.append(msg("tool", f"out {turn}"))
            sequence += 1
    assert sequence == 2000
    request = message_keys(chains[0])
    work, found = _lookup_work(monkeypatch, crowded, "s", request)
    assert found.link is not None
    assert found.link.sequence == 99 * 20
    assert len(found.link.keys) == len(request) - 1
    assert work == LookupWork(links_compared=20, digest_runs=0), work  # 20 chains end in "step 99", not 2,000
    alone_work, _ = _lookup_work(monkeypatch, alone, "s", request)
    assert alone_work == LookupWork(links_compared=1, digest_runs=0), alone_work


def test_a_long_linear_session_looks_up_without_rehashing_its_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 calls in one chain (4,000 messages): continuing the latest call is one index lookup and one list
    comparison of memoized keys, not O(messages) digests or a scan of every call."""
    index = ChainIndex()
    keys = message_keys([msg("system", "s"), msg("user", "task")])
    for turn in range(2000):
        keys.append(message_key(msg("assistant", f"step {turn}", call=f'{{"n": {turn}}}')))
        index.add("s", link(turn, list(keys)), index.find("s", TOOLS, keys[:-1], roles=ROLES).link)
        keys.append(message_key(msg("tool", f"out {turn}")))
    request = keys
    work, found = _lookup_work(monkeypatch, index, "s", request)
    assert found.link is not None
    assert found.link.sequence == 1999
    assert work == LookupWork(links_compared=1, digest_runs=0), work
