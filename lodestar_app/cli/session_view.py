"""What `lodestar session show --calls` prints for a session's captured calls (pure: text in, text out).

Each call: dialect, policy version, finish reason, chain link (continued from which call, or why it started
a new chain), the prompt's tail, and the sampled text with each token's logprob. With a tokenizer (the
served model's directory, `--model DIR`) prompt and sampled tokens are decoded exactly as the model saw
them; without one the prompt tail is the last canonical message and the tokens are shown as ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lodestar.v1 import common_pb2, gateway_pb2

Decode = Callable[[Sequence[int]], str]
PROMPT_TAIL_TOKENS = 48
PROMPT_TAIL_CHARS = 240


def session_line(session: gateway_pb2.Session, calls: int) -> str:
    state = gateway_pb2.SessionState.Name(session.state).removeprefix("SESSION_STATE_").lower()
    labels = " ".join(f"{key}={value}" for key, value in sorted(session.labels.items()))
    run = f" run={session.run_id}" if session.run_id else ""
    return f"session {session.session_id} ({state}){run}, {calls} calls" + (f" [{labels}]" if labels else "")


def summary_line(call: common_pb2.CallRecord) -> str:
    return (
        f"  #{call.sequence} prompt={len(call.prompt_token_ids)} sampled={len(call.completion_token_ids)} "
        f"continued_from={call.continued_from_sequence} policy={call.policy_version}"
    )


def chain_link(call: common_pb2.CallRecord) -> str:
    start = common_pb2.ChainStart.Name(call.chain_start).removeprefix("CHAIN_START_").lower()
    if call.continued_from_sequence >= 0:
        return f"continues #{call.continued_from_sequence} ({call.usage.continued_prompt_tokens} tokens reused)"
    return f"new chain ({start})"


def call_detail(call: common_pb2.CallRecord, decode: Decode | None) -> list[str]:
    dialect = common_pb2.Dialect.Name(call.dialect).removeprefix("DIALECT_").lower()
    finish = common_pb2.FinishReason.Name(call.finish_reason).removeprefix("FINISH_REASON_").lower()
    lines = [
        f"#{call.sequence} {dialect} policy={call.policy_version} finish={finish} {chain_link(call)}",
        f"  prompt: {len(call.prompt_token_ids)} tokens, ends with: {_quote(_prompt_tail(call, decode))}",
        f"  sampled: {len(call.completion_token_ids)} tokens: {_quote(_sampled_text(call, decode))}",
        f"  sampling: {sampling_text(call.sampling)} (asked: {sampling_text(call.requested_sampling)})",
    ]
    pieces = [
        f"{_quote(decode([token])) if decode else token} {logprob:.3f}"
        for token, logprob in zip(call.completion_token_ids, call.completion_logprobs, strict=False)
    ]
    if pieces:
        lines.append("  logprobs: " + " | ".join(pieces))
    return lines


def sampling_text(params: common_pb2.SamplingParams) -> str:
    """`temperature=0.7 top_p=1 top_k=0`: the fields that are set; `-` when none is."""
    names = [name for name in ("temperature", "top_p", "top_k") if params.HasField(name)]
    return " ".join(f"{name}={getattr(params, name):.3g}" for name in names) or "-"


def _prompt_tail(call: common_pb2.CallRecord, decode: Decode | None) -> str:
    if decode is not None:
        return decode(call.prompt_token_ids[-PROMPT_TAIL_TOKENS:])
    if not call.messages:
        return ""
    last = call.messages[-1]
    role = common_pb2.Role.Name(last.role).removeprefix("ROLE_").lower()
    return f"[{role}] " + _text(last)[-PROMPT_TAIL_CHARS:]


def _sampled_text(call: common_pb2.CallRecord, decode: Decode | None) -> str:
    if decode is not None:
        return decode(call.completion_token_ids)
    calls = [f"{tool.name}({tool.arguments_json})" for tool in call.completion.tool_calls]
    return " ".join([_text(call.completion), *calls]).strip()


def _text(message: common_pb2.ChatMessage) -> str:
    parts = message.tool_result.content if message.role == common_pb2.ROLE_TOOL else message.content
    return "".join(part.text.text for part in parts if part.WhichOneof("part") == "text")


def _quote(text: str) -> str:
    return repr(text)
