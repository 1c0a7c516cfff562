"""The scripted engine: programmed replies (text, reasoning, tool calls) for tests and replay.

A script is a JSON file (`--script PATH`, re-read when it changes):

    {
      "select": "turn",            # "turn" (default): reply i answers a chat with i assistant messages;
                                   # "sequence": replies in call order, whatever the chat
      "token_delay_s": 0.0,        # pause before each streamed token (to test streaming/cancellation)
      "context_length": 4096,      # optional: serve as a model with this context (overflow tests)
      "replies": [
        {"tool_calls": [{"name": ["shell", "Bash"], "arguments": {"command": "ls"}}]},
        {"reasoning": "the listing shows it", "text": "Done."},
        {"text": "Half an answer", "fail_after_tokens": 2},  # fails mid-stream (see below)
        {"crash": true},                                     # a bug: raises RuntimeError (gRPC INTERNAL)
        {"echo": true}                                       # the text of the last user message, verbatim
      ],
      "default": {"text": "OK."}   # answers past the end of `replies`
    }

A tool call's `name` is a string or a list of candidates: the first candidate that the request offers as
a tool is used (so one script drives harnesses whose shell tool is `Bash`, `shell` or
`run_shell_command`); with no match the first candidate is used. Replies are rendered in the model's own
tool-call format and tokenized with the real tokenizer, followed by the end-of-turn id, so ids, text and
parsing are exactly those of a real model; each token's logprob is 0.0 (the script is certain). With no
script the engine answers "Hello from the scripted engine." and ends the turn. An `echo` reply stands for a
policy that says whatever its agent asks it to (`lodestar redteam`'s own stack: an adversarial agent that
found an answer gets it into the final answer). A reply with
`fail_after_tokens: N` emits its first N tokens, then raises UnavailableError (the server answers
UNAVAILABLE in the middle of the stream, as a crashed or evicted backend would; N = 0 fails before the
first token; a reply of at most N tokens completes normally). Weight updates are
accepted (metadata checked for well-formedness only) and bump the policy version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.v1 import common_pb2
from lodestar_inference.engine import EngineInfo, EngineRequest, EngineStep, TensorMeta, WeightUpdate
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.toolcalls import ParsedToolCall, ToolCallFormat, format_for

DEFAULT_REPLY: dict[str, Any] = {"text": "Hello from the scripted engine."}


def _pick_name(name: Any, offered: Sequence[str]) -> str:
    candidates = [name] if isinstance(name, str) else list(name or [])
    if not candidates or not all(isinstance(item, str) for item in candidates):
        raise InvalidArgumentError("scripted tool call needs a name (a string or a list of strings)")
    return next((candidate for candidate in candidates if candidate in offered), candidates[0])


def render_reply(reply: dict[str, Any], fmt: ToolCallFormat, offered: Sequence[str], prompt_tail: str) -> str:
    """The text a model would write for `reply`, continuing a prompt that ends with `prompt_tail`."""
    parts: list[str] = []
    reasoning = str(reply.get("reasoning") or "")
    tail = prompt_tail.rstrip()
    if tail.endswith("<think>"):  # the template opened the reasoning block
        parts.append(f"{reasoning}\n</think>\n\n")
    elif reasoning and not tail.endswith("</think>"):
        parts.append(f"<think>\n{reasoning}\n</think>\n\n")
    text = str(reply.get("text") or "")
    parts.append(text)
    for index, call in enumerate(reply.get("tool_calls") or []):
        if text or index:
            parts.append("\n")
        arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
        parts.append(fmt.render(ParsedToolCall(_pick_name(call.get("name"), offered), arguments)))
    return "".join(parts)


def last_user_text(messages: Sequence[common_pb2.ChatMessage]) -> str:
    """The text parts of the last user message, joined ("" when there is none)."""
    users = [message for message in messages if message.role == common_pb2.ROLE_USER]
    if not users:
        return ""
    return "".join(part.text.text for part in users[-1].content if part.WhichOneof("part") == "text")


class ScriptedEngine:
    """See the module docstring; implements `lodestar_inference.engine.Engine`."""

    def __init__(self, model_dir: Path, script: Path | None, tool_call_format: str) -> None:
        self._model_dir = model_dir
        self._script_path = script
        self._format_name = tool_call_format
        self._script: dict[str, Any] = {}
        self._script_mtime = -1.0
        self._calls = 0
        self._version = 0
        self._tokenizer: TextTokenizer | None = None
        self._fmt: ToolCallFormat | None = None
        self._info: EngineInfo | None = None

    async def start(self) -> None:
        tokenizer = TextTokenizer.load(self._model_dir)
        config_path = self._model_dir / "config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._tokenizer = tokenizer
        self._fmt = format_for(self._format_name, tokenizer.chat_template)
        self._info = EngineInfo(
            backend="scripted",
            context_length=int(config.get("max_position_embeddings") or 65536),
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
        )
        self._load_script()

    async def close(self) -> None:
        self._info = None

    def info(self) -> EngineInfo:
        if self._info is None:
            raise UnavailableError("the scripted engine is not running")
        self._load_script()
        if limit := self._script.get("context_length"):
            return dataclasses.replace(self._info, context_length=int(limit))
        return self._info

    @property
    def policy_version(self) -> int:
        return self._version

    def _load_script(self) -> None:
        if self._script_path is None:
            return
        try:
            mtime = self._script_path.stat().st_mtime
            if mtime != self._script_mtime:
                script = json.loads(self._script_path.read_text())
                if not isinstance(script, dict) or not isinstance(script.get("replies", []), list):
                    raise InvalidArgumentError("a script is a JSON object with a list of replies")
                self._script, self._script_mtime = script, mtime
        except (OSError, json.JSONDecodeError) as error:
            raise InvalidArgumentError(f"cannot read script {self._script_path.name}: {error}") from error

    def _reply_for(self, messages: Sequence[common_pb2.ChatMessage]) -> dict[str, Any]:
        self._load_script()
        replies: list[dict[str, Any]] = self._script.get("replies", [])
        if self._script.get("select", "turn") == "sequence":
            index = self._calls
        else:
            index = sum(1 for message in messages if message.role == common_pb2.ROLE_ASSISTANT)
        self._calls += 1
        if index < len(replies):
            return replies[index]
        default: dict[str, Any] = self._script.get("default") or DEFAULT_REPLY
        return default

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        info = self.info()
        tokenizer, fmt = self._tokenizer, self._fmt
        if tokenizer is None or fmt is None:
            raise UnavailableError("the scripted engine is not running")
        if len(request.prompt_ids) >= info.context_length:
            raise InvalidArgumentError(
                f"the prompt has {len(request.prompt_ids)} tokens; the context length is {info.context_length}"
            )
        reply = self._reply_for(request.messages)
        if reply.get("echo"):
            reply = {**reply, "text": last_user_text(request.messages)}
        tail = tokenizer.decode(request.prompt_ids[-8:], skip_special_tokens=False)
        text = render_reply(reply, fmt, [tool.name for tool in request.tools], tail)
        ids = [*tokenizer.encode(text), info.eos_token_ids[0]]
        limit = request.sampling.max_tokens
        ids, finish = (ids[:limit], "length") if len(ids) > limit else (ids, "stop")
        delay = float(self._script.get("token_delay_s", 0.0))
        if reply.get("crash"):
            raise RuntimeError("scripted crash (stands for a bug in the engine)")
        fail_after = reply.get("fail_after_tokens")
        version = self._version
        for position, token in enumerate(ids):
            if fail_after is not None and position >= int(fail_after):
                raise UnavailableError(f"scripted failure after {position} tokens")
            await asyncio.sleep(delay)
            last = position == len(ids) - 1
            logprobs = (0.0,) if request.return_logprobs else ()
            yield EngineStep(
                (token,), logprobs, version, ("length" if finish == "length" else "stop") if last else None
            )

    def validate_weights(self, tensors: Sequence[TensorMeta]) -> None:
        if not tensors:
            raise InvalidArgumentError("weight update carries no tensors")

    async def update_weights(self, update: WeightUpdate) -> int:
        self.validate_weights(update.tensors)
        self._version = update.version
        return self._version


def create_engine(settings: InferenceSettings) -> ScriptedEngine:
    if settings.model is None:
        raise InvalidArgumentError("the scripted backend needs --model DIR (for its tokenizer and template)")
    return ScriptedEngine(settings.model, settings.script, settings.tool_call_format)
