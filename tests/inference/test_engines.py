"""Engines in process (slot freeing, versions, scripted replies), the scripted server, limits and helpers."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from lodestar_inference.engine import EngineRequest, EngineStep, SamplingOptions, TensorMeta, WeightUpdate
from lodestar_inference.engines.scripted import ScriptedEngine
from lodestar_inference.engines.transformers import TransformersEngine
from lodestar_inference.generation import sampling_options
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.weights import check_tensors, in_memory, read_checkpoint_meta, read_safetensors_meta
from tests.inference.conftest import REPO, serve_inference
from tests.inference.helpers import channel, collect, tool, tool_result, user
from tests.waiting import eventually


def engine_request(prompt: tuple[int, ...], max_tokens: int, seed: int = 0, **messages) -> EngineRequest:
    return EngineRequest(f"r{seed}", prompt, SamplingOptions(max_tokens=max_tokens, seed=seed), **messages)


@pytest.fixture
async def engine(tiny_model_dir: Path):
    engine = TransformersEngine(tiny_model_dir, device="cpu", dtype="float32", max_batch_size=1)
    await engine.start()
    yield engine
    await engine.close()


async def test_closing_a_stream_frees_the_slot(engine: TransformersEngine) -> None:
    # One slot: if the cancelled request kept it, the second would wait for 60,000 tokens.
    long = engine.generate(engine_request((5, 6, 7), max_tokens=60000, seed=1))
    steps = [await anext(long), await anext(long)]
    assert all(step.finish_reason is None for step in steps)
    await long.aclose()
    short = [step async for step in engine.generate(engine_request((5, 6, 7), max_tokens=3, seed=2))]
    assert short[-1].finish_reason in ("length", "stop")
    await eventually(engine._running, 5, what="no request running", until=lambda running: running == 0)


async def test_context_overflow_is_refused(engine: TransformersEngine) -> None:
    with pytest.raises(InvalidArgumentError, match="65536"):
        async for _ in engine.generate(engine_request(tuple([5] * 65536), max_tokens=1)):
            pass


async def test_update_keeps_running_requests_on_their_version(
    engine: TransformersEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    running = engine.generate(engine_request((5, 6, 7), max_tokens=30, seed=3))
    first = await anext(running)
    files, metas = read_checkpoint_meta(tiny_model_dir)
    version = await engine.update_weights(WeightUpdate(tiny_model_dir, tuple(metas), 1, tuple(files)))
    assert version == engine.policy_version == 1
    rest = [step async for step in running]
    assert {first.policy_version, *(step.policy_version for step in rest)} == {0}
    fresh = [step async for step in engine.generate(engine_request((5, 6), max_tokens=2, seed=4))]
    assert {step.policy_version for step in fresh} == {1}
    await eventually(  # the old weights are freed
        lambda: [group.version for group in engine._groups],
        5,
        what="only the new weights held",
        until=lambda versions: versions == [1],
    )


async def test_swaps_with_nothing_running_keep_one_copy_of_the_weights(
    engine: TransformersEngine, tiny_model_dir: Path
) -> None:
    files, metas = read_checkpoint_meta(tiny_model_dir)
    for version in (1, 2, 3):
        await engine.update_weights(WeightUpdate(tiny_model_dir, tuple(metas), version, tuple(files)))
    await eventually(
        lambda: [group.version for group in engine._groups], 5, what="one version held", until=lambda v: v == [3]
    )


async def test_a_swap_during_a_prefill_leaves_that_request_decoding(
    engine: TransformersEngine, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos hour: a call arriving as a push lands is prefilled on the old weights while the
    swap publishes the new ones. The swap dropped the old group (no sequence in it yet), the request joined
    it after its prefill, got its first id and was never decoded again: its caller waited until it gave up."""
    entered, release = threading.Event(), threading.Event()
    prefill = engine._prefill

    def held_prefill(model: object, prompt: tuple[int, ...]) -> object:
        entered.set()
        assert release.wait(10), "the test never released the prefill"
        return prefill(model, prompt)

    monkeypatch.setattr(engine, "_prefill", held_prefill)

    async def steps() -> list[EngineStep]:
        return [step async for step in engine.generate(engine_request((5, 6, 7), max_tokens=6, seed=7))]

    call = asyncio.create_task(steps())
    assert await asyncio.to_thread(entered.wait, 10), "the prefill never began"
    files, metas = read_checkpoint_meta(tiny_model_dir)
    await engine.update_weights(WeightUpdate(tiny_model_dir, tuple(metas), 1, tuple(files)))  # lands meanwhile
    release.set()
    done = await asyncio.wait_for(call, 15)  # hung after the first id before the fix
    assert done[-1].finish_reason in ("length", "stop")
    assert {step.policy_version for step in done} == {0}  # sampled by the weights it was prefilled on
    await eventually(
        lambda: [group.version for group in engine._groups], 5, what="the old version freed", until=lambda v: v == [1]
    )


def _mapped_from(tensor: torch.Tensor, path: Path) -> bool:
    """Whether `tensor`'s memory lies in this process's mapping of `path` (/proc/self/maps)."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end:
                return True
    return False


async def test_an_update_in_memory_is_mapped_and_one_on_disk_is_copied(
    engine: TransformersEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A version in /dev/shm (spooled, or shared_fs) becomes the parameters without a copy, and outlives
    its file; one on a disk is copied in (a lazily mapped disk file would be read during generation)."""
    weights = {name: t.detach().clone() + 0.5 for name, t in engine._current.model.state_dict().items()}
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        for version, directory in ((1, shm), (2, tmp_path)):
            path = directory / f"v{version}.safetensors"
            save_file(weights, str(path))
            metas = read_safetensors_meta(path)
            await engine.update_weights(WeightUpdate(path, tuple(metas), version, (path,)))
            served = engine._current.model.state_dict()
            mapped = [_mapped_from(tensor, path) for tensor in served.values()]
            assert all(mapped) if version == 1 else not any(mapped), "in memory: the file's pages, not a copy"
            assert in_memory(path) == (version == 1)
            path.unlink()
            assert all(torch.equal(served[name], weights[name]) for name in weights)
        steps = [step async for step in engine.generate(engine_request((5, 6), max_tokens=2, seed=5))]
        assert steps[-1].policy_version == 2
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_sampling_options_defaults_cap_and_validation() -> None:
    resolved = sampling_options(common_pb2.SamplingParams(max_tokens=64000), cap=256, room=10000)
    assert (resolved.max_tokens, resolved.temperature, resolved.top_p, resolved.top_k, resolved.seed) == (
        256,
        1.0,
        1.0,
        0,
        None,
    )
    assert sampling_options(common_pb2.SamplingParams(), cap=256, room=10).max_tokens == 10
    assert sampling_options(common_pb2.SamplingParams(temperature=0.0, seed=5), cap=8, room=99).temperature == 0.0
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -2}, {"max_tokens": 0}):
        with pytest.raises(InvalidArgumentError):
            sampling_options(common_pb2.SamplingParams(**bad), cap=8, room=99)


def test_safetensors_metadata_and_checks(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.int64)}, str(path))
    metas = {m.name: m for m in read_safetensors_meta(path)}
    assert metas["a"] == TensorMeta("a", (2, 3), "F32")
    expected = {"a": TensorMeta("a", (2, 3), "F32"), "b": TensorMeta("b", (4,), "F32")}
    check_tensors(expected, [metas["a"]])
    for bad in ([metas["b"]], [TensorMeta("a", (3, 2), "F32")], [TensorMeta("c", (1,), "F32")], []):
        with pytest.raises(InvalidArgumentError):
            check_tensors(expected, bad)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(InvalidArgumentError, match="truncated"):
        read_safetensors_meta(path)


SCRIPT = {
    "replies": [
        {
            "reasoning": "look first",
            "tool_calls": [{"name": ["shell", "Bash", "run_shell_command"], "arguments": {"command": "ls"}}],
        },
        {"text": "There is one file."},
    ],
    "default": {"text": "Nothing more."},
}


async def test_scripted_engine_follows_the_script(
    tiny_model_dir: Path, chat_template: ChatTemplate, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    engine = ScriptedEngine(tiny_model_dir, script, "auto")
    await engine.start()
    tools = (tool("Read"), tool("Bash"))
    turn1 = (user("What is here?"),)
    prompt = chat_template.prompt(turn1, tools).ids
    steps = [s async for s in engine.generate(engine_request(prompt, 200, messages=turn1, tools=tools))]
    ids = [t for s in steps for t in s.token_ids]
    text = chat_template.tokenizer.decode(ids, skip_special_tokens=False)
    assert (
        text == "<think>\nlook first\n</think>\n\n"
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    )
    assert steps[-1].finish_reason == "stop"
    assert all(s.logprobs == (0.0,) for s in steps)
    call = common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT)
    call.tool_calls.add(id="c1", name="Bash", arguments_json='{"command": "ls"}')
    turn2 = (*turn1, call, tool_result("c1", "a.txt"))
    steps = [s async for s in engine.generate(engine_request(prompt, 200, messages=turn2))]
    assert chat_template.tokenizer.decode([t for s in steps for t in s.token_ids]) == "There is one file."
    turn3 = (*turn2, call, user("and?"))
    steps = [s async for s in engine.generate(engine_request(prompt, 3, messages=turn3))]
    assert len(steps) == 3
    assert steps[-1].finish_reason == "length"


async def collect_steps(steps: AsyncIterator[EngineStep], into: list[EngineStep]) -> None:
    async for step in steps:
        into.append(step)


async def test_scripted_engine_fails_after_n_tokens(
    tiny_model_dir: Path, chat_template: ChatTemplate, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    reply = {"text": "One two three four five six seven.", "fail_after_tokens": 3}
    script.write_text(json.dumps({"select": "sequence", "replies": [reply, {**reply, "fail_after_tokens": 0}]}))
    engine = ScriptedEngine(tiny_model_dir, script, "auto")
    await engine.start()
    turn = (user("Count."),)
    prompt = chat_template.prompt(turn, ()).ids
    steps: list[EngineStep] = []
    with pytest.raises(UnavailableError, match="after 3 tokens"):
        await collect_steps(engine.generate(engine_request(prompt, 200, messages=turn)), steps)
    assert len(steps) == 3
    assert all(step.finish_reason is None for step in steps)
    assert chat_template.tokenizer.decode([t for s in steps for t in s.token_ids]) == (
        chat_template.tokenizer.decode(chat_template.tokenizer.encode(reply["text"])[:3])
    )
    with pytest.raises(UnavailableError, match="after 0 tokens"):
        await anext(engine.generate(engine_request(prompt, 200, messages=turn)))
    steps = [s async for s in engine.generate(engine_request(prompt, 200, messages=turn))]  # past the script
    assert steps[-1].finish_reason == "stop"


@pytest.mark.slow
async def test_scripted_server_drives_a_tool_loop(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with serve_inference(
        "scripted", tiny_model_dir, tmp_path, "--script", str(script), "--max-new-tokens", "64"
    ) as server:
        async with channel(server.address) as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            messages = [user("What is here?")]
            tools = [tool("shell")]
            out = await collect(stub, inference_pb2.GenerateRequest(messages=messages, tools=tools, stream=True))
            final = out.final
            assert final.finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
            (call,) = final.message.tool_calls
            assert (call.name, json.loads(call.arguments_json)) == ("shell", {"command": "ls"})
            assert final.message.content[0].reasoning.text == "look first"
            messages += [final.message, tool_result(call.id, "a.txt")]
            cont = inference_pb2.Continuation(
                token_ids=[*final.prompt_token_ids, *final.completion_token_ids], message_count=2
            )
            second = (
                await collect(stub, inference_pb2.GenerateRequest(messages=messages, tools=tools, continuation=cont))
            ).final
            assert second.continuation_used
            assert second.finish_reason == common_pb2.FINISH_REASON_STOP
            assert second.message.content[0].text.text == "There is one file."
            none = common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NONE)
            plain = (
                await collect(stub, inference_pb2.GenerateRequest(messages=messages[:1], tools=tools, tool_choice=none))
            ).final
            assert not plain.message.tool_calls
            assert plain.finish_reason == common_pb2.FINISH_REASON_STOP
            assert "<tool_call>" in plain.message.content[-1].text.text
            info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
            assert (info.backend, info.max_new_tokens) == ("scripted", 64)
            body = json.dumps({"messages": [{"role": "ROLE_USER", "content": [{"text": {"text": "hi"}}]}]})
            grpcurl = [str(REPO / ".venv" / "bin" / "grpcurl"), "-plaintext", "-d", body, server.address]
            reply = await asyncio.to_thread(
                subprocess.run,
                [*grpcurl, "lodestar.v1.InferenceService/Generate"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert reply.returncode == 0, reply.stderr
            assert json.loads(reply.stdout)["final"]["finishReason"] == "FINISH_REASON_TOOL_CALLS"
            count = await stub.CountTokens(inference_pb2.CountTokensRequest(messages=messages, tools=tools))
            assert count.prompt_tokens == len(second.prompt_token_ids)


@pytest.mark.slow
def test_init_tiny_cli_is_deterministic(tmp_path: Path, tiny_model_dir: Path) -> None:
    command = [sys.executable, "-m", "lodestar_app.cli.main", "model", "init-tiny", str(tmp_path / "m")]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=120)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["head_dim"], config["max_position_embeddings"], config["vocab_size"]) == (64, 65536, 4096)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (tmp_path / "m" / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0
    assert "not empty" in again.stderr
