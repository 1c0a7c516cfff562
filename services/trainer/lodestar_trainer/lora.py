"""LoRA on the trainer's model: adapters injected with peft, and the adapter's three forms.

This module is the trainer's one user of peft. `apply_lora` injects LoRA layers into a loaded transformers
causal LM in place (the object stays the same model, so forward.py's `model.model` and `model.lm_head` and
every other part work unchanged) and freezes everything but the adapters. The adapter then leaves the trainer
in three forms, all keyed by the base model's module names:

- **checkpoint / export** (`adapter_state`, `save_adapter`): peft's own on-disk format, `adapter_config.json`
  and `adapter_model.safetensors` with `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, so
  `peft.PeftModel.from_pretrained(base, DIR)` loads it;
- **push** (`push_state`): `<module>.lora_A.weight` and `<module>.lora_B.weight` with B already multiplied by
  alpha / rank, so a replica adds `B @ A` to its base weight `<module>.weight` and needs no configuration
  (lodestar_inference/adapter.py is the replica's side);
- **merged** (`merge_into`): base weights plus every adapter's delta, a plain model state dict
  (`export_adapter`: `lodestar export --checkpoint DIR --merged`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.settings import LoraSettings

ADAPTER = "default"
"""peft's adapter name inside the model (one adapter per trainer)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
"""What peft's saved adapter names start with (the PeftModel wrapping the base model)."""
REFUSED_TARGETS = frozenset({"lm_head", "embed_tokens"})
"""Modules the trainer reads directly (forward.py's chunked head) or that are not linear layers."""


def lora_config(settings: LoraSettings) -> LoraConfig:
    """peft's LoraConfig for `settings` (InvalidArgumentError for a setting no adapter can have)."""
    if settings.rank <= 0 or settings.alpha <= 0:
        raise InvalidArgumentError("lora.rank and lora.alpha must be positive")
    if not 0 <= settings.dropout < 1:
        raise InvalidArgumentError("lora.dropout must be in [0, 1)")
    if not settings.target_modules:
        raise InvalidArgumentError("lora.target_modules is empty: name the linear layers that get an adapter")
    refused = sorted(REFUSED_TARGETS.intersection(settings.target_modules))
    if refused:
        raise InvalidArgumentError(f"lora.target_modules cannot name {', '.join(refused)}: only decoder linears")
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by any number
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Inject the adapters of `settings` into `model` in place (A random, B zero: the model's output is
    unchanged) and freeze every other parameter; returns `model` (InvalidArgumentError when no module of
    the model matches `target_modules`)."""
    config = lora_config(settings)
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as error:
        raise InvalidArgumentError(f"lora.target_modules: {error}") from error
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    if not lora_layers(model):
        raise InvalidArgumentError(f"no module of the model matches lora.target_modules {settings.target_modules}")
    return model


def has_lora(model: Any) -> bool:
    """Whether `model` carries LoRA adapters."""
    return any(isinstance(module, LoraLayer) for module in model.modules())


def lora_layers(model: Any) -> dict[str, Any]:
    """The adapted modules of `model` by their base-model name (e.g. model.layers.0.self_attn.q_proj)."""
    return {
        name.removeprefix("module."): module
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter in peft's saved names (`base_model.model.<module>.lora_A.weight`), fp32 CPU copies."""
    state: dict[str, torch.Tensor] = {}
    for name, module in lora_layers(model).items():
        for part in ("lora_A", "lora_B"):
            weight = getattr(module, part)[ADAPTER].weight.detach()
            state[f"{PEFT_PREFIX}{name}.{part}.weight"] = weight.to("cpu", torch.float32).contiguous().clone()
    return state


def push_state(model: Any) -> dict[str, torch.Tensor]:
    """What a policy version pushes: `<module>.lora_A.weight` and `<module>.lora_B.weight`, B scaled by
    alpha / rank (module docstring), fp32 CPU tensors that share no memory with the model."""
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in lora_layers(model).items():
            first = module.lora_A[ADAPTER].weight.detach().to("cpu", torch.float32)
            second = module.lora_B[ADAPTER].weight.detach().to("cpu", torch.float32)
            state[f"{name}.lora_A.weight"] = first.contiguous().clone()
            state[f"{name}.lora_B.weight"] = (second * float(module.scaling[ADAPTER])).contiguous()
    return state


def load_adapter_state(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Set the adapters of `model` from `adapter_state`'s names (InvalidArgumentError when they differ)."""
    layers = lora_layers(model)
    expected = {f"{PEFT_PREFIX}{name}.{part}.weight" for name in layers for part in ("lora_A", "lora_B")}
    if set(state) != expected:
        missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
        raise InvalidArgumentError(
            f"the adapter does not fit lora.target_modules / rank (missing {missing[:3]}, unknown {unknown[:3]})"
        )
    with torch.no_grad():
        for name, module in layers.items():
            for part in ("lora_A", "lora_B"):
                target = getattr(module, part)[ADAPTER].weight
                given = state[f"{PEFT_PREFIX}{name}.{part}.weight"]
                if tuple(given.shape) != tuple(target.shape):
                    raise InvalidArgumentError(
                        f"adapter tensor {name}.{part} has shape {list(given.shape)}, expected {list(target.shape)}"
                    )
                target.copy_(given)


def adapter_config_text(settings: LoraSettings, base_model: str = "") -> str:
    """adapter_config.json of `settings` as peft writes it, naming the base model directory."""
    config = lora_config(settings)
    config.base_model_name_or_path = base_model or None
    document = config.to_dict()  # type: ignore[no-untyped-call]
    for key, value in document.items():
        if isinstance(value, set):
            document[key] = sorted(value)
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def save_adapter(directory: Path, adapter: Mapping[str, torch.Tensor], config_text: str) -> None:
    """Write an adapter (`adapter_state`'s names) and its config to `directory` in peft's format."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ADAPTER_CONFIG).write_text(config_text)
    save_file(dict(adapter), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def read_adapter(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapter tensors and adapter_config.json of a directory `save_adapter` wrote."""
    weights, config = directory / ADAPTER_WEIGHTS, directory / ADAPTER_CONFIG
    if not weights.is_file() or not config.is_file():
        raise InvalidArgumentError(f"{directory} holds no LoRA adapter ({ADAPTER_WEIGHTS}, {ADAPTER_CONFIG})")
    document: dict[str, Any] = json.loads(config.read_text())
    return load_file(str(weights)), document


def settings_of_adapter(config: Mapping[str, Any]) -> LoraSettings:
    """The LoraSettings an adapter_config.json was written with."""
    return LoraSettings(
        enabled=True,
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        dropout=float(config.get("lora_dropout") or 0.0),
        target_modules=sorted(config["target_modules"]),
    )


def merge_into(base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], scale: float) -> dict[str, Any]:
    """`base` (a model state dict) with `scale * B @ A` of each adapted module added to `<module>.weight`, in
    fp32 and cast back to the base dtype; `adapter` in peft's saved names."""
    merged = dict(base)
    for key, first in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        second = adapter[key.replace(".lora_A.weight", ".lora_B.weight")]
        weight = base[f"{module}.weight"]
        delta = scale * (second.to(torch.float32) @ first.to(torch.float32))
        merged[f"{module}.weight"] = (weight.to(torch.float32) + delta).to(weight.dtype)
    return merged


def export_adapter(checkpoint: Path, out: Path, *, merged: bool = False, base: Path | None = None) -> Path:
    """Write the adapter of a LoRA checkpoint to `out`: alone (peft's format: `PeftModel.from_pretrained`
    loads it), or `merged` onto its base model (`base`, else the one its config names) as a plain Hugging Face
    model directory in fp32 that transformers, `lodestar inference serve --model` and `--model` load."""
    from lodestar_trainer.model import load_model, model_files

    adapter, config = read_adapter(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    if not merged:
        save_adapter(out, adapter, (checkpoint / ADAPTER_CONFIG).read_text())
        return out
    named = config.get("base_model_name_or_path")
    source = base or (Path(named) if named else None)
    if source is None:
        raise InvalidArgumentError(f"the adapter in {checkpoint} names no base model: give the base directory")
    settings = settings_of_adapter(config)
    model = load_model(source).eval()
    for file in model_files(source):  # tokenizer and chat template; save_pretrained writes the configs
        (out / file.name).write_bytes(file.read_bytes())
    model.load_state_dict(merge_into(dict(model.state_dict()), adapter, settings.alpha / settings.rank))
    model.save_pretrained(str(out))
    return out
