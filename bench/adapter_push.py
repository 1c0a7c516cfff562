"""Adapter-only push against the full push on the transformers engine: bytes and seconds per push.

One in-process transformers inference server on MODEL (fp32), a trainer-side copy of MODEL with LoRA adapters
(rank 8, 16, 64; every decoder linear), each pushed `--pushes` times over gRPC (WeightPublisher), and the full
state pushed the same number of times; prints one row per payload: bytes, median and best seconds of a push
(the publish call: serialize, stream, validate, merge, swap). Usage:

    nice -n 19 .venv/bin/python -m bench.adapter_push --model .lodestar/models/smollm2 --pushes 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lodestar_trainer.lora import apply_lora, lora_layers, push_state
from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.settings import LoraSettings
from lodestar_trainer.weights.publish import WeightPublisher
from tests.trainer.inference_helpers import InferenceThread


def _timed(address: str, state: dict[str, torch.Tensor], first_version: int, pushes: int) -> tuple[int, list[float]]:
    publisher = WeightPublisher(address, timeout_s=600)
    seconds, size = [], 0
    try:
        for offset in range(pushes):
            started = time.perf_counter()
            result = publisher.publish(state, first_version + offset)
            seconds.append(time.perf_counter() - started)
            size = int(result.payload_bytes)
    finally:
        publisher.close()
    return size, seconds


def _adapted(model_dir: Path, rank: int) -> Any:
    model = apply_lora(load_model(model_dir), LoraSettings(enabled=True, rank=rank, alpha=2.0 * rank))
    with torch.no_grad():
        for module in lora_layers(model).values():
            module.lora_B["default"].weight.normal_(0.0, 0.01)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--pushes", type=int, default=3)
    args = parser.parse_args()
    rows: list[tuple[str, int, list[float]]] = []
    with tempfile.TemporaryDirectory() as spool, InferenceThread.start(args.model, Path(spool)) as server:
        version = 1
        full = load_model(args.model)
        state = dedupe_tied(full, {name: tensor.detach() for name, tensor in full.state_dict().items()})
        size, seconds = _timed(server.address, state, version, args.pushes)
        rows.append(("full", size, seconds))
        version += args.pushes
        del full, state
        for rank in (8, 16, 64):
            payload = push_state(_adapted(args.model, rank))
            size, seconds = _timed(server.address, payload, version, args.pushes)
            rows.append((f"adapter r{rank}", size, seconds))
            version += args.pushes
    print(f"{'payload':<12} {'bytes':>12} {'median s':>9} {'best s':>8}")
    for name, size, seconds in rows:
        print(f"{name:<12} {size:>12,} {statistics.median(seconds):>9.3f} {min(seconds):>8.3f}")


if __name__ == "__main__":
    main()
