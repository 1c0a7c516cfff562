"""Replicas restarted while the trainer waits for groups get its weights (a deadlock the chaos hour found,
docs/chaos.md; control.py `sync_inference`).

In the hour both inference replicas were SIGKILLed within 20 s of each other after the trainer's last push and
came back serving their base model (v0). Nothing pushed again: the trainer pushes after a step, a step needs
groups, and rollout dropped every group the restarted replicas sampled as stale (v0 against v323), so the
trainer waited for 16 minutes, until the run ended. Now a trainer that waits KEEPALIVE_S for a group asks
the replicas which version they serve and pushes its weights to those behind. Real inference replicas
(in-process gRPC, the tiny model); the group source holds its second group back until the test lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_trainer import planner as planner_module
from lodestar_trainer.status import Phase
from lodestar_trainer.weights.publish import FanoutPublisher
from tests.trainer.groups_helpers import RUN, FeedSource, make_group
from tests.trainer.helpers import trainer_for
from tests.trainer.inference_helpers import InferenceThread, served_version
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
CAUGHT_UP_S = 30.0
"""KEEPALIVE_S is 0.2 s here: the push of the tiny model takes well under a second."""


class HeldSource(FeedSource):
    """FeedSource whose groups after the first wait for `release` (rollout with nothing to deliver)."""

    def __init__(self, groups: list[rollout_pb2.Group]) -> None:
        super().__init__(groups)
        self.release = threading.Event()

    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]:
        for index, group in enumerate(super().groups(start_after), start=start_after):
            if index >= 1:
                while not self.release.wait(0.05):
                    if self._cancelled.is_set():
                        return
            yield group


@pytest.mark.parametrize("kept", [0, 1], ids=["every-replica-restarted", "one-replica-restarted"])
def test_replicas_restarted_while_the_trainer_waits_get_its_weights(
    kept: int, trainer_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planner_module, "KEEPALIVE_S", 0.2)
    with (
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-a") as a,
        InferenceThread.start(trainer_model_dir, tmp_path / "spool-b") as b,
    ):
        targets = [a.address, b.address]
        trainer, _ = trainer_for(trainer_model_dir, tmp_path, [], steps=2)
        trainer.source = source = HeldSource([make_group(0), make_group(1)])
        trainer.publisher = publisher = FanoutPublisher(lambda: list(targets), timeout_s=30, writer=RUN)
        thread = threading.Thread(target=trainer.run, name="trainer-under-test", daemon=True)
        try:
            thread.start()
            wait_until(lambda: served_version(a.address) == served_version(b.address) == 1, 120, what="step 1")
            with (
                InferenceThread.start(trainer_model_dir, tmp_path / "spool-c") as c,
                InferenceThread.start(trainer_model_dir, tmp_path / "spool-d") as d,
            ):
                # the fleet as the trainer's discovery sees it now: `kept` of the old replicas, the rest new at v0
                restarted = [c.address, d.address][: 2 - kept]
                targets[:] = [a.address][:kept] + restarted
                expected = 1 if kept == 0 else 2  # one replica still at v1 would refuse v1: all get v2
                wait_until(
                    lambda: {served_version(t) for t in targets} == {expected},
                    CAUGHT_UP_S,
                    what=f"the replicas of {targets} at v{expected} while the trainer waits for a group",
                )
                source.release.set()
                thread.join(120)
                status = trainer.board.snapshot()
                assert (status.phase, status.step) == (Phase.STOPPED, 2), status.error
                assert {served_version(t) for t in targets} == {expected + 1}
        finally:
            source.cancel()
            trainer.control.request_stop()
            thread.join(30)
            publisher.close()
    assert source.reported == ([1, 2] if kept == 0 else [1, 2, 3])  # v1 was known already; v2 past it is told
