"""A trainer restarted behind the versions its own run had inference serve keeps training; behind another
writer's it fails naming that writer (a defect the chaos run found, docs/chaos.md; weights/versions.py).

The trainer pushed versions after its last checkpoint and was killed (mid-push: the replicas on two versions).
Resumed from the checkpoint, its next version is older than what the replicas serve, and they refuse any
version that is not newer: before the fix it was FAILED ("policy version 2 is not newer than the served
version 3"). Now every push names its writer (the run id), each replica records who published its version,
and a trainer whose run published the newer versions pushes its weights past them; a version published by
another writer still stops it, with that writer in the reason. Real inference replicas (in-process gRPC, the
tiny model) over every transport.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.settings import TrainerSettings
from lodestar_trainer.status import Phase, Status
from lodestar_trainer.weights.broadcast import BroadcastPublisher
from lodestar_trainer.weights.publish import FanoutPublisher, ServedVersion, WeightPublisher, WeightsRefusedError
from lodestar_trainer.weights.pushing import ChangedOnlyPublisher
from lodestar_trainer.weights.shared_fs import SharedFsPublisher
from lodestar_trainer.weights.versions import ForeignWriterError, start_version
from lodestar_trainer.wiring import publisher_of
from tests.trainer.groups_helpers import RUN, make_group
from tests.trainer.helpers import trainer_for
from tests.trainer.inference_helpers import InferenceThread

OTHER = "run-other-trainer"


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    model = load_model(model_dir)
    return dedupe_tied(model, dict(model.state_dict()))


def _push(address: str, weights: dict[str, torch.Tensor], version: int, writer: str) -> None:
    publisher = WeightPublisher(address, timeout_s=30, writer=writer)
    try:
        publisher.publish(weights, version)
    finally:
        publisher.close()


def _served(address: str) -> ServedVersion:
    publisher = WeightPublisher(address, timeout_s=30)
    try:
        return publisher.served()
    finally:
        publisher.close()


def _wired(settings: TrainerSettings) -> FanoutPublisher:
    """The publisher `lodestar trainer serve` builds for `--inference A,B`: its pushes name the run."""
    publisher = publisher_of(settings)
    assert isinstance(publisher, FanoutPublisher)
    assert publisher.writer == RUN
    return publisher


def _one_step_after(
    replicas: tuple[InferenceThread, InferenceThread],
    model_dir: Path,
    tmp_path: Path,
    *,
    served: tuple[tuple[int, str], tuple[int, str]],
) -> Status:
    """A fresh trainer of run RUN asked for one step, after each replica was pushed (version, writer) `served`."""
    weights = _weights(model_dir)
    for replica, (version, writer) in zip(replicas, served, strict=True):
        _push(replica.address, weights, version, writer)
    trainer, _ = trainer_for(model_dir, tmp_path, [make_group(0)], steps=1)
    trainer.publisher = publisher = FanoutPublisher([r.address for r in replicas], timeout_s=30, writer=RUN)
    try:
        trainer.run()
    finally:
        publisher.close()
    return trainer.board.snapshot()


@pytest.fixture
def replicas(trainer_model_dir: Path, tmp_path: Path) -> Iterator[tuple[InferenceThread, InferenceThread]]:
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-a") as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-b") as b,
    ):
        yield a, b


# -- the decision (weights/versions.py) -----------------------------------------------------------------------


def _at(*served: tuple[int, str]) -> dict[str, ServedVersion]:
    return {f"r{index}": ServedVersion(*pair) for index, pair in enumerate(served)}


@pytest.mark.parametrize(
    ("version", "served", "expected"),
    [
        (1, _at((3, RUN), (2, RUN)), 4),  # killed past its checkpoint, mid-push
        (0, _at((2, RUN), (2, RUN)), 3),  # killed before its first checkpoint
        (3, _at((3, RUN), (2, RUN)), 4),  # checkpoint at the version one replica has: it would refuse it
        (3, _at((3, RUN), (0, "")), 4),  # one replica restarted meanwhile
        (3, _at((3, RUN), (3, RUN)), None),  # nothing pushed past the checkpoint
        (3, _at((1, RUN), (0, "")), 3),  # replicas behind (restarted): the resumed weights as they are
        (0, _at((0, ""), (0, "")), None),  # a fresh trainer on fresh replicas
        (0, _at((5, "")), None),  # an unnamed writer's version: pushed to as before, and refused
        (1, _at((3, OTHER), (2, OTHER)), None),  # another run's: the same
        (2, _at((3, OTHER), (0, "")), 2),  # the restarted replica gets the state; the other refuses it
        (0, _at((3, RUN)), 4),  # its versions on the one replica there is
    ],
)
def test_the_start_version_from_the_served_versions_and_their_writers(
    version: int, served: dict[str, ServedVersion], expected: int | None
) -> None:
    assert start_version(version, served, RUN) == expected


def test_a_trainer_that_names_no_writer_owns_no_served_version() -> None:
    assert start_version(1, _at((3, ""), (2, "")), "") is None


def test_this_runs_versions_and_another_writers_both_ahead_name_the_other_writer() -> None:
    with pytest.raises(ForeignWriterError, match=f"serves policy version 5 published by writer '{OTHER}'"):
        start_version(1, _at((3, RUN), (5, OTHER)), RUN)


# -- real replicas ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_trainer_resumed_behind_its_runs_served_versions_goes_on_past_them(
    replicas: tuple[InferenceThread, InferenceThread], trainer_model_dir: Path, tmp_path: Path
) -> None:
    a, b = replicas
    inference = f"{a.address},{b.address}"
    groups = [make_group(seed) for seed in range(3)]
    first, _ = trainer_for(trainer_model_dir, tmp_path, groups, steps=1, checkpoint_every=1, inference=inference)
    first.publisher = publisher = _wired(first.settings)
    try:
        first.run()
    finally:
        publisher.close()
    saved = Path(first.board.snapshot().last_checkpoint)
    assert (first.state.step, first.state.policy_version, saved.name) == (1, 1, "step-000001")
    assert _served(a.address) == _served(b.address) == ServedVersion(1, RUN)
    weights = _weights(trainer_model_dir)
    for address in (a.address, b.address):  # the same run's next step, past its checkpoint
        _push(address, weights, 2, RUN)
    _push(a.address, weights, 3, RUN)  # and the one after: killed mid-push, only one replica took it

    resumed, source = trainer_for(
        trainer_model_dir, tmp_path, groups, steps=1, resume=saved, model=None, inference=inference
    )
    assert resumed.state.policy_version == 1
    resumed.publisher = publisher = _wired(resumed.settings)
    try:
        resumed.run()
    finally:
        publisher.close()
    status = resumed.board.snapshot()
    assert (status.phase, status.step, status.policy_version) == (Phase.STOPPED, 2, 5), status.error
    assert _served(a.address) == _served(b.address) == ServedVersion(5, RUN)
    assert source.reported == [4, 5]  # the resumed weights (v4, past v3), then step 2's
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_version"]) for r in records] == [(1, 1), (2, 5)]


@pytest.mark.slow
def test_a_trainer_behind_another_writers_versions_fails_naming_it(
    replicas: tuple[InferenceThread, InferenceThread], trainer_model_dir: Path, tmp_path: Path
) -> None:
    a, b = replicas
    status = _one_step_after(replicas, trainer_model_dir, tmp_path, served=((3, OTHER), (2, OTHER)))
    assert status.phase is Phase.FAILED
    assert "refused the weights of policy version 1" in status.error
    assert f"(published by writer '{OTHER}'; this update is by writer '{RUN}')" in status.error
    assert (_served(a.address), _served(b.address)) == (ServedVersion(3, OTHER), ServedVersion(2, OTHER))


@pytest.mark.slow
def test_this_runs_versions_beside_another_writers_fail_before_any_push(
    replicas: tuple[InferenceThread, InferenceThread], trainer_model_dir: Path, tmp_path: Path
) -> None:
    a, b = replicas
    status = _one_step_after(replicas, trainer_model_dir, tmp_path, served=((3, RUN), (5, OTHER)))
    assert (status.phase, status.step) == (Phase.FAILED, 0)
    assert f"serves policy version 5 published by writer '{OTHER}', not by this run ('{RUN}')" in status.error
    assert (_served(a.address), _served(b.address)) == (ServedVersion(3, RUN), ServedVersion(5, OTHER))


# -- every transport names the writer ---------------------------------------------------------------------------


def _grpc(targets: list[str], shared: Path) -> Any:
    return FanoutPublisher(targets, timeout_s=30, writer=RUN)


def _shared_fs(targets: list[str], shared: Path) -> Any:
    return SharedFsPublisher(targets, shared, timeout_s=30, writer=RUN)


def _broadcast(targets: list[str], shared: Path) -> Any:
    return BroadcastPublisher(targets, broadcast_timeout_s=20, timeout_s=30, writer=RUN)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_grpc, _shared_fs, _broadcast], ids=["grpc", "shared_fs", "broadcast"])
@pytest.mark.parametrize("changed_only", [False, True], ids=["full", "changed_only"])
def test_every_transport_names_the_writer_of_each_version(
    trainer_model_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    make: Callable[[list[str], Path], Any],
    changed_only: bool,
) -> None:
    shared = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="lodestar-test-writer-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    weights = _weights(trainer_model_dir)
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "a", checkpoint_dirs=[shared]) as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "b", checkpoint_dirs=[shared]) as b,
    ):
        assert _served(a.address) == ServedVersion(0, "")  # the weights it started with: no writer
        publisher = make([a.address, b.address], shared)
        if changed_only:
            publisher = ChangedOnlyPublisher(publisher)
        try:
            assert publisher.writer == RUN
            publisher.publish(weights, 1)
            with torch.no_grad():
                weights["lm_head.weight"].mul_(2.0)
            publisher.publish(weights, 2)  # changed-only: the diff against version 1
            assert publisher.served_versions() == {
                a.address: ServedVersion(2, RUN),
                b.address: ServedVersion(2, RUN),
            }
            with pytest.raises(WeightsRefusedError, match=f"published by writer '{RUN}'"):
                publisher.publish(weights, 2)
        finally:
            publisher.close()
