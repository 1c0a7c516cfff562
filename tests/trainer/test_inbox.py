"""Rank 0's wait between steps (lodestar_trainer/inbox.py): a request is served while a group read blocks, groups
are read only when asked for, a quiet wait ends after its timeout or at `wake()`; and on a real Trainer (one
process) SaveCheckpoint is written by the training thread while it waits for groups, and once it has stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_trainer import planner as planner_module
from lodestar_trainer.checkpoint import load_checkpoint
from lodestar_trainer.inbox import IDLE, Idle, Inbox, SaveRequest
from lodestar_trainer.status import Phase
from tests.trainer.groups_helpers import make_group
from tests.trainer.helpers import trainer_for
from tests.waiting import wait_until


class Gate:
    """Groups that come only when released, counting how many were asked for."""

    def __init__(self, groups: list[rollout_pb2.Group]) -> None:
        self.groups = groups
        self.asked = 0
        self.release = threading.Semaphore(0)
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[rollout_pb2.Group]:
        for group in self.groups:
            self.asked += 1
            while not self.release.acquire(timeout=0.05):
                if self.cancelled.is_set():
                    return
            yield group


def test_a_request_is_served_while_a_read_blocks_and_groups_are_read_on_demand() -> None:
    gate = Gate([make_group(0), make_group(1)])
    inbox = Inbox(iter(gate))
    request = SaveRequest(None)
    threading.Timer(0.1, inbox.put, (request,)).start()
    assert inbox.next(30) is request  # the read of the first group is still blocked
    gate.release.release()
    first = inbox.next(30)
    assert isinstance(first, rollout_pb2.Group)
    assert first.group_id == "g0"
    time.sleep(0.2)  # the behaviour under test: nothing reads the next group unasked
    assert gate.asked == 1
    gate.release.release()
    second = inbox.next(30)
    assert isinstance(second, rollout_pb2.Group)
    assert second.group_id == "g1"
    assert (inbox.next(30), inbox.next(30)) == (None, None)  # the groups ended, and stay ended


def test_a_quiet_wait_ends_after_its_timeout_or_when_woken() -> None:
    gate = Gate([make_group(0)])
    inbox = Inbox(iter(gate))
    started = time.monotonic()
    assert inbox.next(0.2) is IDLE
    assert time.monotonic() - started >= 0.2
    threading.Timer(0.1, inbox.wake).start()
    started = time.monotonic()
    assert inbox.next(60) is IDLE
    assert time.monotonic() - started < 30
    gate.cancelled.set()
    assert inbox.next(30) is None


def test_an_error_of_the_group_stream_reaches_the_training_thread() -> None:
    def broken() -> Iterator[rollout_pb2.Group]:
        raise ConnectionError("stream broke")
        yield  # a generator

    inbox = Inbox(broken())
    with pytest.raises(ConnectionError, match="stream broke"):
        inbox.next(30)
    assert inbox.next(30) is None
    assert Inbox(None).next(30) is None


class GateSource:
    """A GroupSource whose groups come through a Gate."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]:
        return iter(self.gate)

    def cancel(self) -> None:
        self.gate.cancelled.set()

    def report_policy_version(self, version: int) -> None:
        pass


@pytest.mark.slow
def test_save_checkpoint_is_written_while_the_loop_waits_for_groups(trainer_model_dir: Path, tmp_path: Path) -> None:
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [])
    gate = Gate([make_group(0), make_group(1)])
    trainer.source = GateSource(gate)
    loop = threading.Thread(target=trainer.run, daemon=True)
    loop.start()
    gate.release.release()
    wait_until(lambda: trainer.board.snapshot().step, 120, what="step 1")
    path, step = trainer.save_now(None, timeout_s=120)  # the loop waits for the second group meanwhile
    assert (path.name, step) == ("step-000001", 1)
    assert load_checkpoint(path).state.groups_read == 1
    trainer.request_stop()
    loop.join(60)
    assert trainer.board.snapshot().phase == Phase.STOPPED
    path, step = trainer.save_now(tmp_path / "after", timeout_s=120)  # stopped: this thread writes it
    assert (path, step) == (tmp_path / "after", 1)
    assert gate.asked == 2  # the second group was asked for, never delivered


@pytest.mark.slow
def test_keepalives_while_waiting_keep_the_groups_read_so_far(
    trainer_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet wait ends every KEEPALIVE_S with a no-op plan (under torchrun: the other ranks' collective
    ends in time); the group read before it still joins the step."""
    monkeypatch.setattr(planner_module, "KEEPALIVE_S", 0.02)
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [], groups_per_step=2, steps=1)
    gate = Gate([make_group(0), make_group(1)])
    trainer.source = GateSource(gate)
    keepalives = 0
    between = trainer.control.between_steps

    def counting(request: SaveRequest | Idle) -> Any:
        nonlocal keepalives
        keepalives += request is IDLE
        return between(request)

    monkeypatch.setattr(trainer.control, "between_steps", counting)
    loop = threading.Thread(target=trainer.run, daemon=True)
    loop.start()
    gate.release.release()
    wait_until(lambda: gate.asked == 2 and keepalives >= 3, 60, what="keepalives while the second group is awaited")
    gate.release.release()
    loop.join(120)
    status = trainer.board.snapshot()
    assert (status.phase, status.step) == (Phase.STOPPED, 1), status.error
    assert status.last_record is not None
    assert status.last_record.values["groups"] == 2
    assert trainer.state.groups_read == 2
