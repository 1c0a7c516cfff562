"""Settings of the trainer service (`lodestar trainer serve`)."""

from __future__ import annotations

from pathlib import Path

from lodestar.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    section = "trainer"

    port: int = 50054
    rollout: str = "127.0.0.1:50053"
    """RolloutService address (groups come from StreamGroups)."""
    inference: str = "127.0.0.1:50051"
    """InferenceService address (weights are pushed with UpdateWeights)."""
    run_id: str | None = None
    """Run to train on."""
    checkpoint_dir: Path = Path(".lodestar/checkpoints")


SETTINGS = TrainerSettings
