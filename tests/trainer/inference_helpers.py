"""The real inference service (transformers backend, tiny model) in-process on its own event-loop thread,
and sessions of real calls made through Generate (token-faithful continuation, real logprobs)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc

from lodestar.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from lodestar_inference.server import build_server
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings

T = TypeVar("T")


class InferenceThread:
    """A transformers-backend inference server on 127.0.0.1:<free port>, served from a background thread."""

    def __init__(self, model_dir: Path, spool_dir: Path, **settings: Any) -> None:
        defaults = {"port": 0, "backend": "transformers", "model": model_dir, "max_new_tokens": 64}
        self.settings = InferenceSettings(**{**defaults, "weights_spool_dir": spool_dir, **settings})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="inference", daemon=True)
        self._service: InferenceService | None = None
        self._server: Any = None
        self.address = ""

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self) -> None:
        self._service = InferenceService.create(self.settings)
        self._server = build_server(self.settings, self._service)
        port = await self._server.start()
        await self._service.start()
        await self._server.set_serving(True)
        self.address = f"127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
        if self._service is not None:
            await self._service.close()

    @classmethod
    @contextlib.contextmanager
    def start(cls, model_dir: Path, spool_dir: Path, **settings: Any) -> Iterator[InferenceThread]:
        """`settings`: more InferenceSettings fields (e.g. dtype)."""
        spool_dir.mkdir(parents=True, exist_ok=True)
        server = cls(model_dir, spool_dir, **settings)
        server._thread.start()
        try:
            server._run(server._start())
            yield server
        finally:
            with contextlib.suppress(Exception):
                server._run(server._stop(), timeout=30.0)
            server._loop.call_soon_threadsafe(server._loop.stop)
            server._thread.join(timeout=10.0)


def served_version(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        info = inference_pb2_grpc.InferenceServiceStub(channel).GetModelInfo(
            inference_pb2.GetModelInfoRequest(), timeout=10
        )
        return int(info.policy_version.version)


def trainer_logprobs(model: Any, final: inference_pb2.GenerateFinal) -> list[float]:
    """A trainer model's logprob of each sampled id of `final` (teacher forcing over prompt + completion)."""
    import torch

    ids = [*final.prompt_token_ids, *final.completion_token_ids]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    start = len(final.prompt_token_ids) - 1
    return [float(logprobs[start + i, token]) for i, token in enumerate(final.completion_token_ids)]


def text_message(role: int, text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))])


def generate(address: str, request: inference_pb2.GenerateRequest) -> inference_pb2.GenerateFinal:
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        for response in stub.Generate(request, timeout=60):
            if response.WhichOneof("event") == "final":
                return response.final
    raise AssertionError("Generate ended without a final event")


def session_calls(address: str, session_id: str, *, turns: int, seed: int) -> list[common_pb2.CallRecord]:
    """`turns` real calls of one session, each continuing the previous one token for token."""
    messages = [
        text_message(common_pb2.ROLE_SYSTEM, "You are a coding agent."),
        text_message(common_pb2.ROLE_USER, "Fix the bug."),
    ]
    calls: list[common_pb2.CallRecord] = []
    continuation: inference_pb2.Continuation | None = None
    for turn in range(turns):
        request = inference_pb2.GenerateRequest(
            messages=messages,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=8, seed=seed * 100 + turn),
            continuation=continuation,
        )
        final = generate(address, request)
        calls.append(
            common_pb2.CallRecord(
                session_id=session_id,
                sequence=turn,
                prompt_token_ids=final.prompt_token_ids,
                completion_token_ids=final.completion_token_ids,
                completion_logprobs=final.completion_logprobs,
                policy_version=final.policy_version,
                finish_reason=final.finish_reason,
                continued_from_sequence=turn - 1 if final.continuation_used else -1,
            )
        )
        messages = [*messages, final.message, text_message(common_pb2.ROLE_USER, f"Tool output {turn}: ok.")]
        continuation = inference_pb2.Continuation(
            token_ids=[*final.prompt_token_ids, *final.completion_token_ids], message_count=len(messages) - 1
        )
    return calls


def greedy(address: str) -> inference_pb2.GenerateFinal:
    """A short greedy reply of the server at `address` (to compare its weights before and after a push)."""
    request = inference_pb2.GenerateRequest(
        messages=[text_message(common_pb2.ROLE_USER, "Say something.")],
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=6),
    )
    return generate(address, request)
