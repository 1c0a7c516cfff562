"""Changed-only weight sync (lodestar_trainer/weights/changes.py) on every transport, against real inference servers
(transformers backend, tiny model): after a changed-only push each replica's logprobs equal the trainer's; a
replica that missed a version (another writer moved it on, as a restart or a missed push does) refuses the
diff and gets the full state of the same version; the bytes sent are the changed tensors'. The mirror's
change detection (bit for bit, in the serving dtype) is checked on its own first."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.broadcast import BroadcastPublisher
from lodestar_trainer.weights.changes import Mirror
from lodestar_trainer.weights.publish import FanoutPublisher, WeightPublisher
from lodestar_trainer.weights.pushing import BackgroundPush, ChangedOnlyPublisher
from lodestar_trainer.weights.shared_fs import SharedFsPublisher
from tests.trainer.inference_helpers import InferenceThread, greedy, served_version, trainer_logprobs

CHANGED = "model.layers.1.mlp.down_proj.weight"
AGAIN = "model.layers.0.self_attn.q_proj.weight"


def test_the_mirror_sends_what_changed_bit_for_bit_in_the_serving_dtype() -> None:
    state = {"a": torch.ones(4, 4), "b": torch.zeros(3), "c": torch.arange(6, dtype=torch.float32)}
    mirror = Mirror()
    first = mirror.take(state, torch.bfloat16, 1)
    assert (first.base, set(first.changed)) == (0, {"a", "b", "c"}), "the first push is the full state"
    assert all(tensor.dtype == torch.bfloat16 for tensor in first.state.values())
    assert mirror.take(state, torch.bfloat16, 2).base == 0, "an unconfirmed push leaves no base"
    mirror.confirm(2)

    state["a"] += 1e-4  # below bf16's resolution at 1.0: the served weights do not change
    state["c"][2] = 7.0
    delta = mirror.take(state, torch.bfloat16, 3)
    assert (delta.base, delta.changed) == (2, ("c",))
    assert delta.diff_bytes == 6 * 2
    assert float(delta.state["c"][2]) == 7.0
    mirror.confirm(3)

    state["b"][0] = -0.0  # equal as numbers, not as bits: sent
    assert mirror.take(state, torch.bfloat16, 4).changed == ("b",)
    mirror.confirm(4)
    nothing = mirror.take(state, torch.bfloat16, 5)
    assert (nothing.base, nothing.changed) == (4, ("b",)), "an empty diff carries the smallest tensor"
    mirror.confirm(5)
    state["b"] = torch.zeros(5)
    assert mirror.take(state, torch.bfloat16, 6).base == 0, "a shape change makes the push full"


def _stepped(model: Any, name: str, scale: float) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        model.get_parameter(name).mul_(scale)
    return dedupe_tied(model, {key: value.detach().clone() for key, value in model.state_dict().items()})


Publishers = dict[str, Callable[[list[str]], Any]]


def _transports(shared: Path) -> Publishers:
    return {
        "grpc": lambda targets: FanoutPublisher(targets, timeout_s=60, attempts=1),
        "shared_fs": lambda targets: SharedFsPublisher(targets, shared, timeout_s=60, attempts=1),
        "broadcast": lambda targets: BroadcastPublisher(targets, broadcast_timeout_s=20, timeout_s=60, attempts=1),
    }


@pytest.mark.slow
def test_changed_only_sync_on_every_transport_and_a_replica_that_missed_a_version(
    trainer_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    shared = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="lodestar-test-changed-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a", checkpoint_dirs=[shared]) as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "b", checkpoint_dirs=[shared]) as b,
    ):
        targets = [a.address, b.address]
        for transport, make in _transports(shared).items():
            model = load_model(trainer_model_dir).eval()
            publisher = ChangedOnlyPublisher(make(targets))
            try:
                version = publisher.served_version() + 1
                full = publisher.publish(_stepped(model, CHANGED, 1.5), version)
                assert full.full_replicas == (), transport
                diff = publisher.publish(_stepped(model, CHANGED, 0.5), version + 1)
                tensor_bytes = model.get_parameter(CHANGED).numel() * 4
                assert (diff.tensors, diff.full_replicas, diff.full_bytes) == (1, (), 0), transport
                assert tensor_bytes <= diff.payload_bytes < tensor_bytes + 1024 < full.payload_bytes, transport
                for address in targets:
                    final = greedy(address)
                    assert final.policy_version == version + 1, transport
                    assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)

                # b misses a version: another writer moves it on, with other weights everywhere
                elsewhere = load_model(trainer_model_dir)
                stray = _stepped(elsewhere, "lm_head.weight", 3.0)
                WeightPublisher(b.address, timeout_s=60).publish(stray, version + 2)
                after = publisher.publish(_stepped(model, AGAIN, 1.3), version + 3)
                assert after.full_replicas == (b.address,), transport
                assert after.full_bytes > after.payload_bytes, transport
                for address in targets:
                    assert served_version(address) == version + 3
                    final = greedy(address)
                    assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)
            finally:
                publisher.close()


@pytest.mark.slow
def test_async_push_of_changed_only_versions_reports_the_changed_bytes(trainer_model_dir: Path, tmp_path: Path) -> None:
    """BackgroundPush with a changed-only publisher: the mirror is the snapshot (a step may change the model
    once `submit` returns), and the bytes it reports are the diff's."""
    model = load_model(trainer_model_dir).eval()
    with InferenceThread.start(trainer_model_dir, tmp_path / "a") as a:
        publisher = ChangedOnlyPublisher(WeightPublisher(a.address, timeout_s=60, attempts=1))
        served: list[int] = []
        pusher = BackgroundPush(publisher, served.append)
        try:
            version = publisher.served_version() + 1
            live = dict(model.state_dict())
            first, _ = pusher.submit(dedupe_tied(model, live), version)
            with torch.no_grad():
                model.get_parameter(CHANGED).mul_(2.0)
            second, _ = pusher.submit(dedupe_tied(model, live), version + 1)
            with torch.no_grad():
                model.get_parameter(CHANGED).mul_(7.0)  # after submit: not part of version + 1
            pusher.wait()
            with torch.no_grad():
                model.get_parameter(CHANGED).div_(7.0)
            assert second == model.get_parameter(CHANGED).numel() * 4 < first
            assert served == [version, version + 1]
            final = greedy(a.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)
        finally:
            pusher.close()
            publisher.close()
