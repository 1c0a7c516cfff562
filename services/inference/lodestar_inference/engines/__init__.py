"""Engine backends behind `lodestar_inference.engine.Engine`, chosen by `InferenceSettings.backend`.

Each backend module `services/inference/lodestar_inference/engines/<backend>.py` exposes
`def create_engine(settings: InferenceSettings) -> Engine`; it is imported only when selected, so the
heavy dependency of one backend (torch, vllm) is never imported by another.
"""

from __future__ import annotations

import importlib

from lodestar_inference.engine import Engine
from lodestar_inference.settings import InferenceSettings

BACKENDS = ("transformers", "vllm", "scripted")


def create(settings: InferenceSettings) -> Engine:
    """Construct (not start) the engine named by `settings.backend`."""
    module = importlib.import_module(f"lodestar_inference.engines.{settings.backend}")
    engine: Engine = module.create_engine(settings)
    return engine
