"""bench/weights.py without replicas: the LoRA rows of the docs section (ratios against the full push of the same
run, the goal line), the replica swap seconds read from replica logs, and the refusals of what cannot run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import pytest

from bench import weights
from bench.inference_servers import ServerProcess


def row(engine: str, replicas: int, transport: str, mode: str, seconds: float, payload: int) -> dict[str, Any]:
    return {"engine": engine, "model": "SmolLM2-135M (fp32)", "replicas": replicas, "transport": transport,
            "mode": mode, "seconds": seconds, "all": [seconds] * 3, "payload": payload, "moved": payload * replicas,
            "compare_cpu": 0.0, "replica_swap": seconds / 2}  # fmt: skip


def test_section_puts_lora_rows_beside_the_full_push_of_the_same_run() -> None:
    lora = weights.LORA_MODE.format(rank=16)
    rows = [
        row("transformers", 3, "shared_fs", "full", 0.30, 540_000_000),
        row("transformers", 3, "shared_fs", lora, 0.03, 19_500_000),
        row("vllm", 3, "shared_fs", "full", 3.0, 540_000_000),
        row("vllm", 3, "shared_fs", lora, 1.5, 19_500_000),
        row("vllm", 3, "grpc", "full", 4.0, 540_000_000),
        row("vllm", 3, "grpc", lora, 2.0, 19_500_000),
    ]
    text = weights.section({"rows": rows, "steps": {}}, 3)
    lines = text.splitlines()
    transformers_lora = next(line for line in lines if line.startswith("| transformers") and lora in line)
    assert "| 0.030 |" in transformers_lora  # seconds
    assert "| 10.0x |" in transformers_lora  # vs full
    assert "| 20 |" in transformers_lora  # MB to a replica
    assert "| 0.015 |" in transformers_lora  # the replica swap column
    vllm_grpc = next(line for line in lines if line.startswith("| vllm") and "grpc" in line and lora in line)
    assert "| 2.0x |" in vllm_grpc  # against vllm's grpc full push, not another engine's or transport's
    goal = next(line for line in lines if line.startswith("Goal (issue 42)"))
    assert "transformers, SmolLM2-135M (fp32): 30 ms (shared_fs, met)" in goal
    assert "vllm, SmolLM2-135M (fp32): 1500 ms (shared_fs, not met)" in goal


def test_native_lora_rows_compare_with_the_vllm_replicas_full_push() -> None:
    lora = weights.LORA_MODE.format(rank=16)
    rows = [
        row("vllm", 3, "shared_fs", "full", 3.0, 540_000_000),
        row("vllm", 3, "shared_fs", lora, 1.5, 19_500_000),
        row("vllm-native", 3, "shared_fs", lora, 0.06, 19_500_000),  # no full row: its replicas refuse one
    ]
    lines = weights.section({"rows": rows, "steps": {}}, 3).splitlines()
    native = next(line for line in lines if line.startswith("| vllm-native"))
    assert "| 50.0x |" in native  # 3.0 / 0.06: vllm's full push of the same run
    goal = next(line for line in lines if line.startswith("Goal (issue 42)"))
    assert "vllm-native, SmolLM2-135M (fp32): 60 ms (shared_fs, not met)" in goal


def test_replica_swaps_is_the_slowest_replica_per_version_median_over_versions(tmp_path: Path) -> None:
    def server(name: str, swaps: dict[int, float]) -> ServerProcess:
        log = tmp_path / f"{name}.log"
        entries = [
            {"event": "policy version published", "policy_version": v, "swap_seconds": s} for v, s in swaps.items()
        ]
        log.write_text("INFO vllm noise {not json}\n" + "".join(json.dumps(entry) + "\n" for entry in entries))
        return ServerProcess("transformers", 0, log, cast(Any, None))

    servers = [server("a", {4: 0.01, 5: 0.02, 6: 0.03, 7: 0.5}), server("b", {5: 0.04, 6: 0.01, 7: 0.6})]
    assert weights.replica_swaps(servers, [5, 6, 7]) == pytest.approx(0.04)  # max per version: .04, .03, .6
    assert weights.replica_swaps(servers, [4]) is None  # b never served 4: no figure from one replica of two


def test_the_bench_refuses_what_it_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def args(**given: Any) -> argparse.Namespace:
        defaults = {"engines": "transformers", "transports": "grpc", "model": "tiny", "lora_ranks": [16]}
        return argparse.Namespace(**(defaults | given))

    weights.refuse_unrunnable(args())
    with pytest.raises(SystemExit, match=r"lora\.rank"):
        weights.refuse_unrunnable(args(lora_ranks=[0]))
    with pytest.raises(SystemExit, match="--engines takes"):
        weights.refuse_unrunnable(args(engines="sglang"))
    if weights.PYTHONS["vllm"].exists():
        with pytest.raises(SystemExit, match="adapters only"):
            weights.refuse_unrunnable(args(engines="vllm-native", lora_ranks=[]))
    monkeypatch.setattr(weights, "SMOLLM2", tmp_path / "absent")
    with pytest.raises(SystemExit, match="import-gguf"):
        weights.refuse_unrunnable(args(model="smollm2"))
    assert weights.ranks("8,16,64") == [8, 16, 64]
    assert weights.ranks("none") == []
