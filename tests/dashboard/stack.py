"""A finished small run behind a real dashboard, for the dashboard tests (JSON and browser).

A real rollout server (in-process, real etcd, real SQLite) runs one run of 3 tasks x 3 samples; a simulated
gateway node (`tests.rollout.helpers.SimNode`: real AcquireSessions / CompleteSession calls) completes its
sessions with made-up but well-formed results: chained calls whose token ids come from a real tokenizer, one
infrastructure failure, and one large session (300 calls, ~15 MB of request bodies). The trainer's real
`MetricsWriter` writes 5 steps of metrics. The dashboard serves it on a free loopback port (and a second one
with a token). Everything runs on one event loop in a background thread, so sync tests (urllib, Playwright's
sync API) can use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from lodestar.etcd import EtcdClient
from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_app.cli.dashboard import token_texts
from lodestar_app.dashboard import server
from lodestar_trainer.metrics import MetricsWriter, StepRecord
from tests.rollout.helpers import INFRA_FAILED, SCORED, make_spec, settings, sim_node, start_rollout

TOKEN = "dashboard-test-token"
REWARDS = {"task-0": [1.0, 0.0, 1.0], "task-1": [0.0, 0.0, 0.0], "task-2": [1.0, 1.0, 0.0]}
STEPS = 5
LARGE_CALLS = 300
LARGE_BODY_BYTES = 50_000
INFRA_ERROR = "runtime: container 3f2a9c0d11ee4b7a died (exit 137)\nlast lines of its log..."
START_TIMEOUT_S = 90.0
_TEXTS = [
    "You are a coding agent. Fix the bug so that the tests pass.",
    "The function add(a, b) in calc.py returns a - b; make it return a + b.",
    "I will read calc.py first.",
    "def add(a, b):\n    return a - b\n",
    "Running the tests now: 1 failed, 3 passed.",
    "Done: add() now returns a + b and every test passes.",
]


def build_tokenizer(directory: Path) -> Path:
    """A small byte-level BPE tokenizer (the `tokenizers` library, no torch) with a chat template and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_TEXTS * 4, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _text(role: int, text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))])


@dataclass
class CallMaker:
    """Makes CallRecords whose ids are real encodings (so the dashboard can decode them)."""

    encode: Any
    clock: float = field(default_factory=time.time)

    def record(
        self, session_id: str, sequence: int, prompt: list[int], reply: str, **fields: Any
    ) -> common_pb2.CallRecord:
        completion = self.encode(reply)
        call = common_pb2.CallRecord(
            session_id=session_id,
            sequence=sequence,
            dialect=common_pb2.DIALECT_OPENAI_CHAT,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=[-((index * 7) % 10) / 3 for index in range(len(completion))],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            completion=_text(common_pb2.ROLE_ASSISTANT, reply),
            policy_version=1,
            first_token_ms=12.5,
            **fields,
        )
        call.usage.prompt_tokens, call.usage.completion_tokens = len(prompt), len(completion)
        call.started_at.FromNanoseconds(int((self.clock + sequence * 1.5) * 1e9))
        call.finished_at.FromNanoseconds(int((self.clock + sequence * 1.5 + 1.0) * 1e9))
        return call

    def chained(self, session_id: str) -> list[common_pb2.CallRecord]:
        """Three calls: the first, one extending it token by token, and one whose history drifted."""
        system, user = _text(common_pb2.ROLE_SYSTEM, _TEXTS[0]), _text(common_pb2.ROLE_USER, _TEXTS[1])
        first_prompt = self.encode(_TEXTS[0] + _TEXTS[1])
        first = self.record(session_id, 0, first_prompt, _TEXTS[2], chain_start=common_pb2.CHAIN_START_FIRST,
                            continued_from_sequence=-1, messages=[system, user],
                            original_request_json=json.dumps({"model": "m", "messages": ["..."]}))  # fmt: skip
        tool = common_pb2.ChatMessage(
            role=common_pb2.ROLE_TOOL,
            tool_result=common_pb2.ToolResult(
                tool_call_id="c1",
                name="read",
                content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=_TEXTS[3]))],
            ),
        )
        shared = list(first_prompt) + list(first.completion_token_ids)
        second = self.record(session_id, 1, shared + self.encode(_TEXTS[3]), _TEXTS[4],
                             chain_start=common_pb2.CHAIN_START_CONTINUED, continued_from_sequence=0,
                             messages=[system, user, first.completion, tool], original_request_json="{}")  # fmt: skip
        second.usage.continued_prompt_tokens = len(shared)
        second.completion.tool_calls.add(id="c2", name="run_tests", arguments_json='{"path": "."}')
        third = self.record(session_id, 2, self.encode(_TEXTS[0] + _TEXTS[4]), _TEXTS[5],
                            chain_start=common_pb2.CHAIN_START_DRIFT, continued_from_sequence=-1,
                            messages=[system, _text(common_pb2.ROLE_USER, _TEXTS[4])])  # fmt: skip
        return [first, second, third]

    def large(self, session_id: str) -> list[common_pb2.CallRecord]:
        prompt = self.encode(_TEXTS[1])
        body = json.dumps({"model": "m", "padding": "x" * LARGE_BODY_BYTES})
        return [
            self.record(
                session_id,
                index,
                prompt,
                _TEXTS[2],
                chain_start=common_pb2.CHAIN_START_BRANCH,
                continued_from_sequence=-1,
                original_request_json=body,
                messages=[_text(common_pb2.ROLE_USER, _TEXTS[1])],
            )
            for index in range(LARGE_CALLS)
        ]


def _result_fields(task_id: str, sample: int) -> dict[str, Any]:
    details = struct_pb2.Struct()
    details.update({"passed": 3 + sample, "failed": 1 - min(sample, 1), "output": f"{task_id} sample {sample}"})
    fields: dict[str, Any] = {
        "stdout_tail": f"agent stdout of {task_id}/{sample}\nall done",
        "stderr_tail": "warning: something on stderr",
        "verifier_details": details,
        "final_answer": _TEXTS[5],
        "harness": "command",
        "exit_code": 0,
    }
    for name, seconds in (("init_duration", 0.4), ("ready_duration", 0.1), ("agent_duration", 4.0),
                          ("post_duration", 0.6), ("session_duration", 5.1)):  # fmt: skip
        fields[name] = _duration(seconds)
    return fields


def _duration(seconds: float) -> Any:
    from google.protobuf import duration_pb2

    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


@dataclass
class RecordedRun:
    run_id: str
    sessions: dict[tuple[str, int], str]
    """(task id, sample) -> session id."""
    large_session: str
    chained_session: str
    failed_session: str
    metrics: list[StepRecord]


async def record_run(rollout: Any, etcd: EtcdClient, runs_dir: Path, encode: Any) -> RecordedRun:
    """Create the run, complete every session through a simulated node, write the trainer's metrics."""
    spec = make_spec(tasks=3, group_size=3)
    spec.name = "dashboard-test"
    run_id = await rollout.create_run(spec)
    groups = await rollout.stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id))
    sessions = {(s.task_id, s.sample): s.session_id for g in groups.groups for s in g.sessions}
    where = {session_id: key for key, session_id in sessions.items()}
    maker = CallMaker(encode)
    large, failed = sessions[("task-1", 0)], sessions[("task-2", 0)]
    failed_once = False
    async with sim_node(etcd, rollout.stub, "node-dash-1", ttl=60) as node:
        async with asyncio.timeout(60):
            while (await rollout.get_run(run_id)).state == rollout_pb2.RUN_STATE_RUNNING:
                for assignment in await node.acquire(9):
                    task_id, sample = where[assignment.session_id]
                    if assignment.session_id == failed and not failed_once:
                        failed_once = True
                        await node.complete(assignment, INFRA_FAILED, 0.0, calls=[], error=INFRA_ERROR)
                        continue
                    calls = maker.large(assignment.session_id) if assignment.session_id == large else None
                    await node.complete(assignment, SCORED, REWARDS[task_id][sample],
                                        calls=calls or maker.chained(assignment.session_id),
                                        **_result_fields(task_id, sample))  # fmt: skip
                await asyncio.sleep(0.05)
    writer = MetricsWriter(runs_dir / run_id, tensorboard=False)
    records = [
        StepRecord(
            step,
            step,
            {
                "reward_mean": 0.2 * step,
                "reward_std": 0.3,
                "pass_rate": 0.1 * step,
                "loss": 1.0 / step,
                "kl": 0.01 * step,
                "groups": 2.0,
                "groups_no_signal": 1.0,
                "time_build": 0.1,
                "time_forward_backward": 0.5,
                "time_push": 0.05,
                "tokens_per_second": 1000.0 + step,
                "custom_metric": float(step),
            },
        )
        for step in range(1, STEPS + 1)
    ]
    for record in records:
        writer.write(record)
    writer.close()
    return RecordedRun(run_id, sessions, large, sessions[("task-0", 0)], failed, records)


class DashboardStack:
    """The recorded run, a dashboard on it (`url`) and one with a token (`token_url`), on a background loop."""

    def __init__(self, root: Path, etcd_endpoint: str, etcd_prefix: str) -> None:
        self.root = root
        self.model_dir = build_tokenizer(root / "tokenizer")
        self._config = settings(root / "rollout.sqlite", etcd_endpoint, etcd_prefix)
        self._etcd_endpoint = etcd_endpoint
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.url = self.token_url = self.rollout_address = ""
        self.run: RecordedRun | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="dashboard-stack", daemon=True)

    def start(self) -> DashboardStack:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError(f"the dashboard stack did not start within {START_TIMEOUT_S:.0f} s")
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            texts = token_texts(self.model_dir)
            async with start_rollout(self._config) as rollout:
                async with EtcdClient(self._etcd_endpoint) as etcd:
                    encode = _encoder(self.model_dir)
                    self.run = await record_run(rollout, etcd, self.root / "runs", encode)
                self.rollout_address = rollout.address
                common = {"rollout": rollout.address, "port": 0, "runs_dir": self.root / "runs", "token_texts": texts}
                plain = await server.start(server.DashboardSettings(**common))
                secured = await server.start(server.DashboardSettings(**common, token=TOKEN))
                self.url, self.token_url = plain.url, secured.url
                self._ready.set()
                await self._stop.wait()
                await plain.close()
                await secured.close()
        except BaseException as error:
            self.error = error
            self._ready.set()


def _encoder(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return lambda text: list(tokenizer.encode(text).ids)
