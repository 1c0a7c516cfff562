"""The dashboard's JSON documents, as pure functions of rollout messages and metrics records (no I/O, no
aiohttp): the runs table, a run's training curves, groups with advantages and failure causes, a session's
timeline and a page of its calls, and one call as a conversation and as tokens with their logprobs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from google.protobuf import json_format

from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_trainer.step.advantages import AdvantageKind, group_advantages, has_signal

Json = dict[str, Any]
TokenTexts = Callable[[Sequence[int]], list[str]]
"""Each token id's text (the served model's tokenizer), one string per id."""
MAX_TOKENS_SHOWN = 20_000
"""A call shows at most this many prompt tokens (the tail) and sampled tokens (the head)."""
MAX_REQUEST_CHARS = 200_000
"""The original request body is shown up to this many characters."""
CHARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward_mean", "reward_std", "reward_mean_trained")),
    ("pass rate", ("pass_rate",)),
    ("loss", ("loss",)),
    ("KL", ("kl",)),
    ("clip fraction", ("clip_fraction",)),
    (
        "logprob gap: trainer vs inference, same version (nats)",
        ("logprob_diff_mean", "logprob_diff_max", "logprob_diff_mean/*"),
    ),
    ("policy drift of stale samples (nats)", ("policy_drift_mean", "policy_drift_max")),
    ("staleness (versions)", ("staleness_mean", "staleness_max")),
    ("tokens/s", ("tokens_per_second",)),
    ("merge ratio", ("merge_ratio",)),
    ("step time (s)", ("time_build", "time_forward_backward", "time_optimizer", "time_push", "time_step")),
)
"""The named charts, first; every other metric gets a chart of its own after them. A name ending in `/*` takes
every metric with that prefix (`logprob_diff_mean/<harness>`). The gap chart is the mismatch that means a bug
(tokens sampled by the version the step updates); the drift of stale tokens, which the updates since sampling
explain, is its own chart next to the staleness (services/trainer/lodestar_trainer/step/mismatch.py)."""
_NOT_CURVES = frozenset({"step", "time", "policy_version"})
_HEX_RUN = re.compile(r"\b[0-9a-f]{8,}\b")


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """`SESSION_OUTCOME_SCORED` -> "scored"; an unknown value -> its number."""
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def _seconds(stamp: Any) -> float | None:
    return stamp.ToNanoseconds() / 1e9 if stamp.seconds or stamp.nanos else None


# -- runs ------------------------------------------------------------------------------------------


def run_row(run: rollout_pb2.Run, metrics: Sequence[Json]) -> Json:
    """One row of the runs table: state, progress, groups, sessions by outcome, training steps."""
    tasks = len(run.spec.tasks)
    last = metrics[-1] if metrics else {}
    return {
        "run_id": run.run_id,
        "name": run.spec.name,
        "state": enum_name(rollout_pb2.RunState, run.state, "RUN_STATE_"),
        "created_at": _seconds(run.created_at),
        "tasks": tasks,
        "group_size": run.spec.group_size,
        "progress": run.groups_complete / tasks if tasks else 0.0,
        "policy_version": run.policy_version,
        "reward_mean": run.reward_mean,
        "groups": {
            "complete": run.groups_complete,
            "delivered": run.groups_delivered,
            "trained": int(sum(record.get("groups", 0.0) for record in metrics)),
            "stale": run.groups_dropped,
            "no_signal": int(last.get("groups_no_signal", 0.0)),
        },
        "sessions": {
            "total": run.sessions_total,
            "pending": run.sessions_pending,
            "ready": run.sessions_ready,
            "running": run.sessions_running,
            "scored": run.sessions_succeeded,
            "timed_out": run.sessions_timed_out,
            "failed": run.sessions_failed,
            "cancelled": run.sessions_cancelled,
        },
        "infra_failures": run.infra_failures,
        "stage_seconds_mean": dict(run.stage_seconds_mean),
        "steps": len(metrics),
    }


def curves(metrics: Sequence[Json]) -> Json:
    """The training curves: x = step, one chart per named group of metrics present, then one per other metric.
    Every series has one value per step (null where a step did not log it)."""
    steps = [int(record["step"]) for record in metrics]
    present = {key for record in metrics for key in record} - _NOT_CURVES
    charts: list[Json] = []
    named: set[str] = set()
    for title, names in CHARTS:
        shown = [key for name in names for key in _matching(name, present)]
        named.update(shown)
        if shown:
            charts.append({"title": title, "series": shown})
    charts.extend({"title": name, "series": [name]} for name in sorted(present - named))
    for chart in charts:
        chart["values"] = [[record.get(name) for record in metrics] for name in chart["series"]]
    return {"steps": steps, "charts": charts}


def _matching(name: str, present: set[str]) -> list[str]:
    """`name` if present; for `prefix/*`, the present metrics under the prefix, sorted."""
    if name.endswith("/*"):
        return sorted(key for key in present if key.startswith(name[:-1]))
    return [name] if name in present else []


# -- groups and failures ---------------------------------------------------------------------------


def session_row(session: rollout_pb2.SessionSummary) -> Json:
    return {
        "session_id": session.session_id,
        "sample": session.sample,
        "status": enum_name(rollout_pb2.SessionStatus, session.status, "SESSION_STATUS_"),
        "outcome": enum_name(rollout_pb2.SessionOutcome, session.outcome, "SESSION_OUTCOME_"),
        "stage": enum_name(rollout_pb2.SessionStage, session.stage, "SESSION_STAGE_"),
        "reward": session.reward if session.status == rollout_pb2.SESSION_STATUS_SCORED else None,
        "attempt": session.attempt,
        "failures": session.failures,
        "node_id": session.node_id,
        "policy_versions": [session.min_policy_version, session.max_policy_version],
    }


def group_rows(groups: Iterable[rollout_pb2.GroupSummary], kind: AdvantageKind) -> list[Json]:
    """Each group with its samples side by side; a scored sample's advantage is the trainer's group-relative
    advantage (`kind`) over the group's scored samples (what a step trains on once the group is delivered)."""
    rows = []
    for group in groups:
        samples = [session_row(session) for session in group.sessions]
        scored = [sample for sample in samples if sample["reward"] is not None]
        rewards = [float(sample["reward"]) for sample in scored]
        for sample, advantage in zip(scored, group_advantages(rewards, kind) if rewards else [], strict=True):
            sample["advantage"] = advantage
        rows.append(
            {
                "group_id": group.group_id,
                "task_id": group.task_id,
                "status": enum_name(rollout_pb2.GroupStatus, group.status, "GROUP_STATUS_"),
                "completion_seq": group.completion_seq,
                "delivery_seq": group.delivery_seq,
                "dropped": group.dropped,
                "signal": has_signal(rewards),
                "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                "policy_versions": [group.min_policy_version, group.max_policy_version],
                "samples": samples,
            }
        )
    return rows


def failure_cause(outcome: str, error: str) -> str:
    """What a failed attempt's failures have in common: its outcome and the first line of its error, with
    long hex runs (ids) blanked so failures of one kind count together."""
    line = (error.strip().splitlines() or [""])[0][:200]
    return f"{outcome}: {_HEX_RUN.sub('…', line)}" if line else outcome


def failure_causes(attempts: Iterable[rollout_pb2.FailedAttempt]) -> list[Json]:
    """Failed attempts counted by cause, most frequent first, each with a few of its sessions."""
    causes: dict[str, Json] = {}
    for attempt in attempts:
        cause = failure_cause(attempt.outcome, attempt.error)
        entry = causes.setdefault(cause, {"cause": cause, "outcome": attempt.outcome, "count": 0, "sessions": []})
        entry["count"] += 1
        if len(entry["sessions"]) < 5 and attempt.session_id not in entry["sessions"]:
            entry["sessions"].append(attempt.session_id)
    return sorted(causes.values(), key=lambda entry: (-entry["count"], entry["cause"]))


# -- sessions --------------------------------------------------------------------------------------


def _duration(value: Any) -> float:
    return float(value.ToNanoseconds() / 1e9)


def chain(call: common_pb2.CallRecord) -> Json:
    """Which earlier call this one extends (and how many prompt tokens it reused), or how its chain started."""
    return {
        "continued_from": call.continued_from_sequence if call.continued_from_sequence >= 0 else None,
        "start": enum_name(common_pb2.ChainStart, call.chain_start, "CHAIN_START_"),
        "reused_tokens": call.usage.continued_prompt_tokens,
    }


def call_row(call: common_pb2.CallRecord) -> Json:
    """A call as a line of a session's timeline (no bodies, no tokens)."""
    started, finished = _seconds(call.started_at), _seconds(call.finished_at)
    logprobs = list(call.completion_logprobs)
    return {
        "sequence": call.sequence,
        "dialect": enum_name(common_pb2.Dialect, call.dialect, "DIALECT_"),
        "started_at": started,
        "finished_at": finished,
        "first_token_ms": call.first_token_ms,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.completion_token_ids),
        "logprob_mean": sum(logprobs) / len(logprobs) if logprobs else None,
        "finish_reason": enum_name(common_pb2.FinishReason, call.finish_reason, "FINISH_REASON_"),
        "policy_version": call.policy_version,
        "chain": chain(call),
    }


def session_view(detail: rollout_pb2.GetSessionDetailResponse, offset: int, limit: int) -> Json:
    """The session, its attempts, its result (verifier output, stdout/stderr tails, stage times) and the
    requested page of its calls."""
    view: Json = {
        "session": {
            **session_row(detail.session),
            "run_id": detail.session.run_id,
            "group_id": detail.session.group_id,
            "task_id": detail.session.task_id,
        },
        "attempts": [
            {
                "attempt": a.attempt,
                "node_id": a.node_id,
                "acquired_at": _seconds(a.acquired_at),
                "ended_at": _seconds(a.ended_at),
                "outcome": a.outcome or "running",
                "error": a.error,
                "stage_seconds": dict(a.stage_seconds),
            }
            for a in detail.attempts
        ],
        "result": None,
        "calls": [],
        "call_count": detail.call_count,
        "offset": offset,
        "limit": limit,
    }
    if detail.HasField("result"):
        result = detail.result
        view["result"] = {
            "attempt": result.attempt,
            "node_id": result.node_id,
            "outcome": enum_name(rollout_pb2.SessionOutcome, result.outcome, "SESSION_OUTCOME_"),
            "reward": result.reward,
            "exit_code": result.exit_code,
            "error": result.error,
            "final_answer": result.final_answer,
            "harness": result.harness,
            "stdout_tail": result.stdout_tail,
            "stderr_tail": result.stderr_tail,
            "verifier_details": json_format.MessageToDict(result.verifier_details),
            "stages": {
                "init": _duration(result.init_duration),
                "ready": _duration(result.ready_duration),
                "run": _duration(result.agent_duration),
                "post": _duration(result.post_duration),
                "session": _duration(result.session_duration),
            },
        }
        view["calls"] = [call_row(call) for call in result.calls]
    return view


# -- one call --------------------------------------------------------------------------------------


def _parts(parts: Iterable[common_pb2.ContentPart]) -> list[Json]:
    out: list[Json] = []
    for part in parts:
        kind = part.WhichOneof("part")
        if kind == "text":
            out.append({"kind": "text", "text": part.text.text})
        elif kind == "reasoning":
            out.append({"kind": "reasoning", "text": part.reasoning.text or "(redacted)"})
        elif kind == "image":
            out.append({"kind": "image", "text": f"[image {part.image.media_type}]"})
    return out


def message_view(message: common_pb2.ChatMessage) -> Json:
    tool_result = None
    if message.HasField("tool_result"):
        result = message.tool_result
        tool_result = {
            "tool_call_id": result.tool_call_id,
            "name": result.name,
            "is_error": result.is_error,
            "content": _parts(result.content),
        }
    return {
        "role": enum_name(common_pb2.Role, message.role, "ROLE_"),
        "name": message.name,
        "content": _parts(message.content),
        "tool_calls": [{"id": t.id, "name": t.name, "arguments": t.arguments_json} for t in message.tool_calls],
        "tool_result": tool_result,
    }


def _request_body(text: str) -> str:
    try:
        pretty = json.dumps(json.loads(text), indent=1, ensure_ascii=False)
    except ValueError:
        pretty = text
    return pretty if len(pretty) <= MAX_REQUEST_CHARS else pretty[:MAX_REQUEST_CHARS] + "\n… (cut)"


def tokens(ids: Sequence[int], texts: TokenTexts | None, logprobs: Sequence[float] | None = None) -> list[Json]:
    shown: list[Json] = [{"id": token} for token in ids]
    if texts is not None:
        for entry, text in zip(shown, texts(ids), strict=True):
            entry["text"] = text
    if logprobs is not None:
        for entry, logprob in zip(shown, logprobs, strict=False):
            entry["logprob"] = logprob
    return shown


def call_view(
    call: common_pb2.CallRecord, call_count: int, texts: TokenTexts | None, *, max_tokens: int = MAX_TOKENS_SHOWN
) -> Json:
    """One call: the conversation as the harness sent it (canonical messages, tools, the raw request body),
    the reply, its chain link, and its prompt and sampled tokens (each sampled token with its logprob).
    `prompt_shared` is how many leading prompt tokens were the earlier call's tokens (the chain link)."""
    prompt_ids = list(call.prompt_token_ids)
    cut = max(len(prompt_ids) - max_tokens, 0)
    completion_ids = list(call.completion_token_ids)[:max_tokens]
    return {
        **call_row(call),
        "session_id": call.session_id,
        "call_count": call_count,
        "sampling": json_format.MessageToDict(call.sampling),
        "requested_sampling": json_format.MessageToDict(call.requested_sampling),
        "messages": [message_view(message) for message in call.messages],
        "tools": [tool.name for tool in call.tools],
        "completion": message_view(call.completion),
        "original_request": _request_body(call.original_request_json),
        "prompt_shared": call.usage.continued_prompt_tokens,
        "prompt_cut": cut,
        "prompt": tokens(prompt_ids[cut:], texts),
        "completion_cut": len(call.completion_token_ids) - len(completion_ids),
        "sampled": tokens(completion_ids, texts, list(call.completion_logprobs)[:max_tokens]),
        "decoded": texts is not None,
    }
