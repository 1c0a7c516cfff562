"""Seeded synthetic groups of CallRecords shaped like real harness sessions (tests and benchmarks).

A group is `group_size` sessions of one task. Every session starts from the same prompt: a system+tools
prefix and the task text, shared by the whole group (as in a real run). Then the main chain runs turns:
each call's prompt is the previous call's prompt + sampled tokens + the tool result (plus a few turn
markers), exactly like token-faithful continuation at inference; the last call ends the session.
Optional branches, each drawn per turn with its probability:

- sub-agent: a separate chain of a few calls that starts from the tools part of the prefix and a
  sub-task of its own, runs after the current main call, and whose result comes back as the next
  tool result of the main chain;
- compaction (at most once per session, after the third turn): the main chain restarts from the
  prefix + a summary, so the next call extends no earlier call (a chain break);
- retry: the call is sent again with the same prompt and sampled anew; the chain goes on from the retry.

Token ids are uniform over `vocab_size` (no special meaning), captured logprobs uniform in
`logprob_range`. Sequence numbers follow completion order and `continued_from_sequence` names the call
each prompt extends (-1 for a new chain), as the gateway records them. No torch here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from lodestar.v1 import common_pb2
from lodestar_trainer.data.batch import Sample
from lodestar_trainer.step.advantages import AdvantageKind, group_advantages

TURN_MARKER_TOKENS = 3
"""Tokens of role markers between a completion and the next message (`<|im_end|>\\n<|im_start|>user`)."""


@dataclass(frozen=True)
class SessionShape:
    """How the sessions of a group look. Ranges are inclusive (low, high)."""

    prefix_tokens: int = 16_000
    """System prompt + tool schemas, shared by every session of the group."""
    task_tokens: int = 200
    """The task text, shared by every session of the group."""
    turns: tuple[int, int] = (10, 30)
    """Calls of the main chain (not counting retries and sub-agent calls)."""
    tool_result_tokens: tuple[int, int] = (100, 2_000)
    reply_tokens: tuple[int, int] = (50, 500)
    vocab_size: int = 4_096
    subagent_probability: float = 0.0
    subagent_calls: tuple[int, int] = (2, 4)
    subagent_task_tokens: tuple[int, int] = (50, 300)
    compaction_probability: float = 0.0
    summary_tokens: tuple[int, int] = (200, 600)
    retry_probability: float = 0.0
    logprob_range: tuple[float, float] = (-3.0, -0.01)


SMALL_SHAPE = SessionShape(
    prefix_tokens=48,
    task_tokens=8,
    turns=(3, 5),
    tool_result_tokens=(4, 16),
    reply_tokens=(2, 8),
    vocab_size=256,
    subagent_probability=0.3,
    subagent_calls=(1, 3),
    subagent_task_tokens=(3, 8),
    compaction_probability=0.25,
    summary_tokens=(4, 10),
    retry_probability=0.25,
)
"""Short sessions with every kind of branch, for tests on the tiny model."""


class _SessionWriter:
    """Appends the calls of one session in completion order."""

    def __init__(self, session_id: str, shape: SessionShape, rng: random.Random) -> None:
        self.session_id = session_id
        self.shape = shape
        self.rng = rng
        self.calls: list[common_pb2.CallRecord] = []

    def tokens(self, span: tuple[int, int]) -> list[int]:
        count = self.rng.randint(*span)
        return [self.rng.randrange(self.shape.vocab_size) for _ in range(count)]

    def call(self, prompt: list[int], continued_from: int, last: bool = False) -> list[int]:
        """Sample one call on `prompt`; return prompt + sampled ids (what the next prompt extends)."""
        completion = self.tokens(self.shape.reply_tokens)
        low, high = self.shape.logprob_range
        record = common_pb2.CallRecord(
            session_id=self.session_id,
            sequence=len(self.calls),
            dialect=common_pb2.DIALECT_OPENAI_CHAT,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=[self.rng.uniform(low, high) for _ in completion],
            finish_reason=common_pb2.FINISH_REASON_STOP if last else common_pb2.FINISH_REASON_TOOL_CALLS,
            continued_from_sequence=continued_from,
            usage=common_pb2.Usage(
                prompt_tokens=len(prompt),
                completion_tokens=len(completion),
                continued_prompt_tokens=len(self.calls[continued_from].prompt_token_ids)
                + len(self.calls[continued_from].completion_token_ids)
                if continued_from >= 0
                else 0,
            ),
        )
        self.calls.append(record)
        return prompt + completion

    def turn_markers(self) -> list[int]:
        return [self.rng.randrange(self.shape.vocab_size) for _ in range(TURN_MARKER_TOKENS)]


def _session(
    session_id: str, shared: list[int], tools_len: int, shape: SessionShape, seed: int
) -> list[common_pb2.CallRecord]:
    rng = random.Random(seed)
    writer = _SessionWriter(session_id, shape, rng)
    turns = rng.randint(*shape.turns)
    prompt, continued_from, compacted = list(shared), -1, False
    for turn in range(turns):
        last = turn == turns - 1
        context = writer.call(prompt, continued_from, last=last)
        if not last and rng.random() < shape.retry_probability:
            context = writer.call(prompt, continued_from)
        continued_from = len(writer.calls) - 1
        if last:
            break
        if rng.random() < shape.subagent_probability:
            sub_prompt = shared[:tools_len] + writer.tokens(shape.subagent_task_tokens)
            sub_from = -1
            for _ in range(rng.randint(*shape.subagent_calls)):
                sub_context = writer.call(sub_prompt, sub_from)
                sub_from = len(writer.calls) - 1
                sub_prompt = sub_context + writer.turn_markers() + writer.tokens(shape.tool_result_tokens)
        if not compacted and turn >= 2 and rng.random() < shape.compaction_probability:
            compacted = True
            prompt, continued_from = shared + writer.tokens(shape.summary_tokens), -1
            continue
        prompt = context + writer.turn_markers() + writer.tokens(shape.tool_result_tokens)
    return writer.calls


def synthetic_group(
    shape: SessionShape, *, group_size: int = 8, seed: int = 0, group_id: str = "g0"
) -> list[list[common_pb2.CallRecord]]:
    """The calls of each session of one group (`group_size` lists, each in sequence order)."""
    rng = random.Random(f"{seed}:{group_id}")
    prefix = [rng.randrange(shape.vocab_size) for _ in range(shape.prefix_tokens)]
    task = [rng.randrange(shape.vocab_size) for _ in range(shape.task_tokens)]
    shared = prefix + task
    tools_len = shape.prefix_tokens // 2
    return [
        _session(f"{group_id}-s{index}", shared, tools_len, shape, rng.randrange(2**31)) for index in range(group_size)
    ]


def synthetic_samples(
    shape: SessionShape,
    *,
    group_size: int = 8,
    seed: int = 0,
    group_id: str = "g0",
    first_sample_index: int = 0,
    advantage: AdvantageKind = AdvantageKind.ZSCORE,
    rewards: Sequence[float] | None = None,
) -> list[Sample]:
    """One group as Samples: seeded rewards in [0, 1] (or `rewards`) and their group advantages."""
    sessions = synthetic_group(shape, group_size=group_size, seed=seed, group_id=group_id)
    if rewards is None:
        rng = random.Random(f"{seed}:{group_id}:rewards")
        rewards = [round(rng.random(), 3) for _ in sessions]
    if len(rewards) != len(sessions):
        raise ValueError(f"{len(rewards)} rewards for {len(sessions)} sessions")
    advantages = group_advantages(rewards, advantage)
    return [
        Sample(
            sample_index=first_sample_index + index,
            session_id=calls[0].session_id,
            reward=reward,
            advantage=adv,
            calls=calls,
        )
        for index, (calls, reward, adv) in enumerate(zip(sessions, rewards, advantages, strict=True))
    ]
