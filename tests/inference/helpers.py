"""Helpers of the inference tests: canonical messages, a Generate collector, weight pushes, teacher forcing."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc.aio
import torch
from safetensors.torch import save

from lodestar.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from lodestar_inference.sampling import processed_logprobs
from tests.waiting import eventually

BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def cancelled_generations(server_log: str, request_id: str) -> list[dict[str, object]]:
    """The "generate cancelled" records of `request_id` in an inference server's JSON log."""
    records = [json.loads(line) for line in server_log.splitlines() if line.startswith("{") and request_id in line]
    return [record for record in records if record.get("event") == "generate cancelled"]


async def generation_cancelled(server_log: Callable[[], str], request_id: str) -> list[dict[str, object]]:
    """Wait (20 s at most) until the server logged that it stopped the cancelled generation `request_id`;
    its "generate cancelled" records."""
    return await eventually(
        lambda: cancelled_generations(server_log(), request_id),
        20,
        interval_s=0.2,
        what="the server to stop the cancelled generation",
    )


def text_message(role: int, text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))])


def user(text: str) -> common_pb2.ChatMessage:
    return text_message(common_pb2.ROLE_USER, text)


def system(text: str) -> common_pb2.ChatMessage:
    return text_message(common_pb2.ROLE_SYSTEM, text)


def tool(name: str, schema: Mapping[str, object] | None = None) -> common_pb2.ToolDefinition:
    return common_pb2.ToolDefinition(
        name=name, description=f"the {name} tool", parameters_json=json.dumps(schema or BASH_SCHEMA)
    )


def tool_result(call_id: str, text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(
        role=common_pb2.ROLE_TOOL,
        tool_result=common_pb2.ToolResult(
            tool_call_id=call_id, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=text))]
        ),
    )


def sampling(**kwargs: object) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**kwargs)  # type: ignore[arg-type]


@dataclass
class Collected:
    deltas: list[inference_pb2.GenerateDelta] = field(default_factory=list)
    finals: list[inference_pb2.GenerateFinal] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    @property
    def final(self) -> inference_pb2.GenerateFinal:
        assert len(self.finals) == 1, f"expected exactly one final, got {len(self.finals)}"
        return self.finals[0]


async def collect(stub: inference_pb2_grpc.InferenceServiceStub, request: inference_pb2.GenerateRequest) -> Collected:
    out = Collected()
    async for response in stub.Generate(request, timeout=120):
        kind = response.WhichOneof("event")
        out.events.append(kind)
        if kind == "delta":
            out.deltas.append(response.delta)
        else:
            out.finals.append(response.final)
    return out


def channel(address: str) -> grpc.aio.Channel:
    options = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
    return grpc.aio.insecure_channel(address, options=options)


def safetensors_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    return save({name: tensor.detach().contiguous() for name, tensor in tensors.items()})


def weight_stream(
    payload: bytes, *, version: int = 0, chunk: int = 64 * 1024, total: int | None = None
) -> Iterator[inference_pb2.UpdateWeightsRequest]:
    header = inference_pb2.WeightsHeader(total_bytes=len(payload) if total is None else total, policy_version=version)
    yield inference_pb2.UpdateWeightsRequest(header=header)
    stream = io.BytesIO(payload)
    while piece := stream.read(chunk):
        yield inference_pb2.UpdateWeightsRequest(chunk=piece)


async def push_weights(
    stub: inference_pb2_grpc.InferenceServiceStub, tensors: Mapping[str, torch.Tensor], *, version: int = 0
) -> inference_pb2.UpdateWeightsResponse:
    async def requests():  # grpc.aio takes an async iterator for client streams
        for item in weight_stream(safetensors_bytes(tensors), version=version):
            yield item

    response: inference_pb2.UpdateWeightsResponse = await stub.UpdateWeights(requests(), timeout=120)
    return response


def teacher_logprobs(
    model: torch.nn.Module,
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    temperature: float,
    top_k: int,
    top_p: float,
) -> torch.Tensor:
    """Logprob of each completion id under a teacher-forced forward pass, processed like sampling was."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    logprobs = processed_logprobs(rows, temperature, top_k, top_p)
    return logprobs[torch.arange(len(completion)), torch.tensor(list(completion))]


def train_to_answer(
    model_dir: Path, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, max_steps: int = 150
) -> dict[str, torch.Tensor]:
    """Fine-tune a copy of the model until greedy decoding of each prompt yields its answer; its state dict."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = []
    for prompt, answer in pairs:
        ids = torch.tensor([list(prompt) + list(answer)])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        batches.append((ids, labels, len(prompt), torch.tensor(list(answer))))
    for _ in range(max_steps):
        optimizer.zero_grad()
        learned = True
        for ids, labels, start, target in batches:
            out = model(input_ids=ids, labels=labels)
            probs = out.logits[0, start - 1 : -1].detach().softmax(-1)
            learned &= bool(torch.equal(probs.argmax(-1), target)) and float(probs.max(-1).values.min()) > 0.6
            out.loss.backward()
        if learned:
            break
        optimizer.step()
    else:
        raise AssertionError("the tiny model did not learn the answers")
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
