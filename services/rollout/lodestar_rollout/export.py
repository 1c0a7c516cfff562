"""Accepted trajectories of a run as SFT data (`lodestar export`): the data-generation use of the pipeline.

The export reads the rollout service's durable store (the same `Store` interface the service uses, so a
SQLite file or a PostgreSQL URL), not the RolloutService API: `StreamGroups` serves only delivered groups,
decides each group's staleness fate as it sends it (a side effect an export must not have) and waits while
the run is running, whereas the store holds every counted result of every session, whatever the trainer did.

One record per **chain end** of a session whose counted reward is at least `min_reward`: a call that no
later call of the session continues (`continued_from_sequence`). A linear session (one conversation) gives
one record; a session with sub-agents or a compaction gives one per branch. A record carries

- `messages`: the chat exactly as the harness sent it in that call (canonical form rendered as OpenAI Chat
  messages: `content` text, assistant `tool_calls` with `arguments` as the JSON text the model produced,
  `tool` messages with `tool_call_id`), followed by the model's completion as the last assistant message;
- `tools`: the tool definitions of that call (OpenAI `{"type": "function", "function": {...}}`);
- `reward`, `run_id`, `session_id`, `task_id`, `policy_version` (the newest version that sampled a token of the chain);
- `token_ids` (the chain end's prompt ids + its sampled ids: the exact tokens of the whole conversation, the
  model's own tokens never re-tokenized) and `loss_mask` (1 on every token some call of the chain sampled,
  0 on prompt, tool-result and template tokens), ready for token-level SFT.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lodestar.chat_json import message_dict, tool_dict
from lodestar.errors import NotFoundError
from lodestar.policy_versions import call_version_range
from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_rollout.model import SessionStatus
from lodestar_rollout.store import Store


@dataclass(frozen=True)
class ExportStats:
    sessions: int
    """Scored sessions of the run (counted results)."""
    accepted: int
    """Sessions whose reward is at least the threshold."""
    records: int
    """Chain ends written (at least one per accepted session that made a call)."""


def chain_ends(calls: Sequence[common_pb2.CallRecord]) -> list[common_pb2.CallRecord]:
    """The calls no later call continues, in sequence order."""
    continued = {c.continued_from_sequence for c in calls if c.continued_from_sequence >= 0}
    return sorted((c for c in calls if c.sequence not in continued), key=lambda c: c.sequence)


def loss_mask(end: common_pb2.CallRecord, by_sequence: dict[int, common_pb2.CallRecord]) -> list[int]:
    """1 on the tokens sampled by `end` and every call its prompt continues, 0 elsewhere."""
    total = len(end.prompt_token_ids) + len(end.completion_token_ids)
    mask = [0] * total
    call: common_pb2.CallRecord | None = end
    seen: set[int] = set()
    while call is not None and call.sequence not in seen:
        seen.add(call.sequence)
        start = len(call.prompt_token_ids)
        for i in range(start, min(start + len(call.completion_token_ids), total)):
            mask[i] = 1
        call = by_sequence.get(call.continued_from_sequence) if call.continued_from_sequence >= 0 else None
    return mask


def session_records(result: rollout_pb2.SessionResult, *, run_id: str, task_id: str) -> Iterator[dict[str, Any]]:
    """The SFT records (one per chain end) of one scored session."""
    by_sequence = {c.sequence: c for c in result.calls}
    for end in chain_ends(result.calls):
        chain_versions = [call_version_range(end)[1]]
        link = end.continued_from_sequence
        while link >= 0 and link in by_sequence and len(chain_versions) <= len(by_sequence):
            chain_versions.append(call_version_range(by_sequence[link])[1])
            link = by_sequence[link].continued_from_sequence
        yield {
            "run_id": run_id,
            "session_id": result.session_id,
            "task_id": task_id,
            "call_sequence": end.sequence,
            "reward": result.reward,
            "policy_version": max(chain_versions),
            "messages": [message_dict(m) for m in end.messages] + [message_dict(end.completion)],
            "tools": [tool_dict(t) for t in end.tools],
            "token_ids": [*end.prompt_token_ids, *end.completion_token_ids],
            "loss_mask": loss_mask(end, by_sequence),
        }


def accepted_records(store: Store, run_id: str, min_reward: float) -> tuple[list[dict[str, Any]], ExportStats]:
    """Every SFT record of `run_id` whose session's counted reward is >= `min_reward` (task order, then sample)."""
    spec = store.run_spec(run_id)
    if spec is None:
        raise NotFoundError(f"run {run_id!r} is not in the store")
    tasks = spec.tasks
    sessions = store.run_sessions(run_id)
    scored = [s for s in sessions if s.status == SessionStatus.SCORED and s.counted]
    accepted = [s for s in scored if s.reward >= min_reward]
    task_of = {s.session_id: tasks[s.task_index].task_id if s.task_index < len(tasks) else "" for s in accepted}
    records: list[dict[str, Any]] = []
    for result in store.counted_results([s.session_id for s in accepted]):
        records.extend(session_records(result, run_id=run_id, task_id=task_of[result.session_id]))
    return records, ExportStats(len(scored), len(accepted), len(records))
