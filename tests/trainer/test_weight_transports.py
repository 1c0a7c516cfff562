"""Weight transports other than the gRPC stream (lodestar_trainer/weights/broadcast.py, shared_fs.py) against real
inference servers (transformers backend, tiny model): a gloo broadcast to two replicas, whose logprobs then
equal the trainer's; a version written once to a shared directory and loaded by path; a replica killed
after joining the broadcast group, which must cost the push a bounded wait while the live replica still
takes the version."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.broadcast import BroadcastPublisher, bucket_sizes
from lodestar_trainer.weights.publish import WeightsRefusedError, serialize
from lodestar_trainer.weights.shared_fs import SharedFsPublisher
from tests.inference.conftest import serve_inference
from tests.trainer.inference_helpers import InferenceThread, greedy, served_version, trainer_logprobs

pytestmark = pytest.mark.slow


def _changed_model(model_dir: Path, scale: float) -> Any:
    model = load_model(model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


def test_buckets_hold_whole_tensors_and_cover_the_data(trainer_model_dir: Path) -> None:
    model = load_model(trainer_model_dir)
    payload = serialize(dedupe_tied(model, dict(model.state_dict())))
    start, sizes = bucket_sizes(payload, 100_000)
    assert start + sum(sizes) == len(payload)
    assert len(sizes) > 2
    start_one, whole = bucket_sizes(payload, 1 << 40)
    assert (start_one, whole) == (start, [len(payload) - start])
    _, each = bucket_sizes(payload, 1)
    assert len(each) == len(dedupe_tied(model, dict(model.state_dict()))), "a tensor over the size is alone"


def test_a_gloo_broadcast_makes_two_replicas_serve_the_trainers_weights(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    model = _changed_model(trainer_model_dir, 3.0)
    state = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a") as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "b") as b,
    ):
        before = greedy(a.address)
        publisher = BroadcastPublisher([a.address, b.address], broadcast_timeout_s=20, bucket_bytes=200_000)
        try:
            version = publisher.served_version() + 1
            result = publisher.publish(state, version)
            assert sorted(publisher.last_broadcast) == sorted([a.address, b.address]), "both took it by broadcast"
            assert result.policy_version == version
            assert result.payload_bytes == len(serialize(state))
            assert (served_version(a.address), served_version(b.address)) == (version, version)
            for address in (a.address, b.address):
                final = greedy(address)
                assert final.policy_version == version
                assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)
            assert list(before.completion_logprobs) != pytest.approx(trainer_logprobs(model, before), abs=1e-2)

            with pytest.raises(WeightsRefusedError, match="not newer"):  # the refusal crosses the broadcast
                publisher.publish(state, version)
            assert served_version(a.address) == version
        finally:
            publisher.close()
        assert not list((tmp_path / "a").iterdir()), "the received payload's spool file is deleted"


def test_shared_fs_writes_each_version_once_and_sends_its_path(
    trainer_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """In /dev/shm, as on one machine: the replicas map the file (no copy) and still answer the trainer's
    logprobs after the file is gone."""
    shared = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="lodestar-test-shared-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    model = _changed_model(trainer_model_dir, 2.0)
    state = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a", checkpoint_dirs=[shared]) as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "b", checkpoint_dirs=[shared]) as b,
    ):
        publisher = SharedFsPublisher([a.address, b.address], shared, timeout_s=30)
        try:
            version = publisher.served_version() + 1
            publisher.publish(state, version)
            assert (served_version(a.address), served_version(b.address)) == (version, version)
            final = greedy(b.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)
            publisher.publish(state, version + 1)
            assert [path.name for path in shared.iterdir()] == [f"policy-v{version + 1:06d}.safetensors"]
            again = greedy(a.address)  # served from the mapping of a file deleted since
            assert again.completion_logprobs == pytest.approx(trainer_logprobs(model, again), abs=1e-4)
        finally:
            publisher.close()
    with InferenceThread.start(trainer_model_dir, tmp_path / "c") as closed:  # no --checkpoint-dirs
        publisher = SharedFsPublisher([closed.address], shared, timeout_s=30)
        try:
            with pytest.raises(WeightsRefusedError, match="checkpoint-dirs"):
                publisher.publish(state, 1)
        finally:
            publisher.close()


class _KillingBroadcast(BroadcastPublisher):
    """Kills one replica's process once the groups formed, before a bucket is sent: it dies mid-broadcast."""

    victim: subprocess.Popen[bytes] | None = None
    _lock = threading.Lock()

    def _send(self, group: Any, push: Any, mac: Any) -> None:
        with self._lock:
            if self.victim is not None:
                self.victim.send_signal(signal.SIGKILL)
                self.victim.wait()
                self.victim = None
        super()._send(group, push, mac)


def test_a_replica_dying_during_the_broadcast_costs_a_bounded_wait(trainer_model_dir: Path, tmp_path: Path) -> None:
    model = _changed_model(trainer_model_dir, 0.5)
    state = dedupe_tied(model, dict(model.state_dict()))
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a") as live,
        serve_inference(  # its spool dir: a process killed mid-receive leaves its spool file behind
            "transformers", trainer_model_dir, tmp_path, "--weights-spool-dir", str(tmp_path)
        ) as doomed,
    ):
        timeout_s = 5.0
        publisher = _KillingBroadcast(
            [live.address, doomed.address], broadcast_timeout_s=timeout_s, timeout_s=30, attempts=1
        )
        try:
            version = publisher.served_version() + 1
            publisher.victim = doomed.process
            started = time.monotonic()
            result = publisher.publish(state, version)
            took = time.monotonic() - started
            assert result.policy_version == version
            assert served_version(live.address) == version
            assert doomed.process.poll() is not None
            assert publisher.last_broadcast == [live.address], "the live replica's transfer is its own"
            assert took < timeout_s + 10, f"the push took {took:.1f} s"
            final = greedy(live.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)

            publisher.publish(state, version + 1)  # the dead replica is left out at the probe
            assert publisher.last_broadcast == [live.address]
            assert served_version(live.address) == version + 1
        finally:
            publisher.close()


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: NCCL between the trainer (GPU 0) and a replica (GPU 1)"
)
def test_an_nccl_broadcast_reaches_a_replica_on_another_gpu(
    trainer_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.cuda.init()  # the trainer's process sees every GPU before the replica is confined to the second
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with serve_inference(
        "transformers", trainer_model_dir, tmp_path, "--device", "cuda", "--weights-spool-dir", str(tmp_path)
    ) as replica:
        monkeypatch.undo()
        model = _changed_model(trainer_model_dir, 3.0)
        publisher = BroadcastPublisher([replica.address], backend="nccl", broadcast_timeout_s=60)
        try:
            version = publisher.served_version() + 1
            publisher.publish(dedupe_tied(model, dict(model.state_dict())), version)
            assert publisher.last_broadcast == [replica.address]
            final = greedy(replica.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=2e-2)
        finally:
            publisher.close()
