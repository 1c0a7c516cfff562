"""Pushes that overlap the next step (lodestar_trainer/weights/pushing.py, `async_push`): one version in flight, rollout
told only once inference serves it, a push's error raised in the trainer; and a real trainer over a real
inference service (transformers backend, tiny model) ends with inference serving its last version."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from lodestar.errors import UnavailableError
from lodestar_trainer.status import Phase
from lodestar_trainer.weights.publish import PublishResult, WeightPublisher, serialize
from lodestar_trainer.weights.pushing import BackgroundPush, Snapshot, shares_memory
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, FeedSource, make_group
from tests.trainer.helpers import trainer_settings
from tests.trainer.inference_helpers import InferenceThread, served_version


class SlowPublisher:
    """Takes `seconds` per push (after `gate` opens, when given), records how many ran at once, fails on
    version `fail_at`."""

    def __init__(self, seconds: float, fail_at: int = -1, gate: threading.Event | None = None) -> None:
        self.seconds, self.fail_at, self.gate = seconds, fail_at, gate
        self.dtype: torch.dtype | None = None
        self.payloads: list[bytes] = []
        self.active = self.most_active = 0
        self.versions: list[int] = []
        self._lock = threading.Lock()

    def payload_dtype(self) -> torch.dtype | None:
        return self.dtype

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult:
        started = time.perf_counter()
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if self.gate is not None:
                assert self.gate.wait(30.0), "the test never opened the gate"
            payload = serialize(state, self.dtype)  # after the gate: the state as it is by then
            time.sleep(self.seconds)
            if version == self.fail_at:
                raise UnavailableError(f"no inference replica took policy version {version}")
            self.versions.append(version)
            self.payloads.append(payload)
            return PublishResult(version, len(state), len(payload), time.perf_counter() - started, 1)
        finally:
            with self._lock:
                self.active -= 1


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.ones(4, 4)}


def test_one_version_in_flight_and_rollout_hears_it_once_served() -> None:
    gate = threading.Event()
    publisher, served = SlowPublisher(0.3, gate=gate), []
    push = BackgroundPush(publisher, served.append)
    size, waited = push.submit(_state(), 1)  # returns while the push waits at the gate: it goes on in the background
    assert (size > 0, waited, served, publisher.versions) == (True, 0.0, [], [])
    threading.Timer(0.2, gate.set).start()
    _, waited = push.submit(_state(), 2)
    assert waited > 0.1, "the second version waits for the first to land"
    assert served == [1]
    assert push.wait() > 0.1
    assert (served, publisher.versions, publisher.most_active) == ([1, 2], [1, 2], 1)
    push.close()


def test_a_failed_push_is_raised_by_the_next_submit() -> None:
    push = BackgroundPush(SlowPublisher(0.05, fail_at=1), lambda version: None)
    push.submit(_state(), 1)
    with pytest.raises(UnavailableError, match="policy version 1"):
        push.submit(_state(), 2)
    push.close()


def test_the_pushed_version_is_the_state_at_submit_not_after_the_next_step() -> None:
    """The trainer's thread returns from submit while the push waits; the optimizer then changes the
    model's memory in place: the version pushed must be the state as it was at submit."""
    gate = threading.Event()
    publisher = SlowPublisher(0.0, gate=gate)
    push = BackgroundPush(publisher, lambda version: None)
    weight = torch.ones(4, 4)
    size, _ = push.submit({"w": weight}, 1, copy=True)
    weight.add_(1.0)  # the next optimizer step
    gate.set()
    push.wait()
    assert size == 16 * 4
    assert torch.equal(load(publisher.payloads[0])["w"], torch.ones(4, 4))
    push.close()


def test_a_snapshot_reuses_its_buffers_and_casts_to_the_payload_dtype() -> None:
    snapshot = Snapshot()
    state = {"w": torch.randn(8, 4), "step": torch.tensor([3])}
    first = snapshot.take(state, torch.bfloat16)
    assert (first["w"].dtype, first["step"].dtype) == (torch.bfloat16, torch.int64)
    assert torch.equal(first["w"], state["w"].to(torch.bfloat16))
    state["w"].mul_(2)
    second = snapshot.take(state, torch.bfloat16)
    assert second["w"].data_ptr() == first["w"].data_ptr(), "the buffer is reused, not allocated again"
    assert torch.equal(second["w"], state["w"].to(torch.bfloat16))
    assert snapshot.take(state, None)["w"].dtype == torch.float32, "a new dtype gets a new buffer"


def test_a_state_is_copied_only_when_it_is_the_models_memory() -> None:
    model = torch.nn.Linear(4, 4)
    assert shares_memory(model.state_dict(), model)
    assert not shares_memory({name: t.clone() for name, t in model.state_dict().items()}, model)


def test_the_payload_is_in_the_publishers_dtype() -> None:
    publisher = SlowPublisher(0.0)
    publisher.dtype = torch.bfloat16
    push = BackgroundPush(publisher, lambda version: None)
    size, _ = push.submit({"w": torch.ones(4, 4)}, 1)
    push.wait()
    assert size == 16 * 2
    assert load(publisher.payloads[0])["w"].dtype == torch.bfloat16
    push.close()


@pytest.mark.slow
def test_a_trainer_with_async_push_ends_with_inference_serving_its_last_version(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    groups = [make_group(seed) for seed in range(3)]
    settings = trainer_settings(run=RUN, model=trainer_model_dir, run_dir=tmp_path / "run", lr=1e-3,
                               micro_batch_tokens=256, steps=3, async_push=True, inference="")  # fmt: skip
    with InferenceThread.start(trainer_model_dir, tmp_path / "spool") as inference:
        trainer = create_trainer(settings, connect=False)
        source = FeedSource(groups)
        trainer.source = source
        trainer.publisher = WeightPublisher(inference.address, timeout_s=30)
        base = served_version(inference.address)
        trainer.run()
        status = trainer.board.snapshot()
        assert status.phase is Phase.STOPPED, status.error
        assert served_version(inference.address) == base + 3
    assert source.reported == [1, 2, 3]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert all(r["push_bytes"] > 0 and "push_wait_s" in r for r in records)
