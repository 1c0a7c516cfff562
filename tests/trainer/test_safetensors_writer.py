"""`write_safetensors` (lodestar_trainer/weights/shared_fs.py) writes a version's file straight from the tensors: the
safetensors library and inference's header reader read it back exactly, cast to the payload dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lodestar_inference.weights import read_safetensors_meta
from lodestar_trainer.weights.publish import serialize
from lodestar_trainer.weights.shared_fs import write_safetensors


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    weight = torch.randn(6, 5, requires_grad=True)
    return {
        "layer.weight": weight,
        "layer.transposed": weight.detach().t(),  # not contiguous
        "scale": torch.tensor(0.5),  # 0-d
        "empty": torch.zeros(0, 3),
        "positions": torch.arange(7),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(3, 2).to(torch.bfloat16),
    }


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_the_file_reads_back_as_the_state_in_the_payload_dtype(tmp_path: Path, dtype: torch.dtype | None) -> None:
    state = _state()
    path = tmp_path / "v.safetensors"
    size = write_safetensors(state, path, dtype)
    assert size == path.stat().st_size
    loaded = load_file(str(path))
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        want = tensor.detach().to(dtype) if dtype is not None and tensor.is_floating_point() else tensor.detach()
        assert loaded[name].dtype == want.dtype, name
        assert torch.equal(loaded[name], want), name
    metas = {meta.name: meta for meta in read_safetensors_meta(path)}
    assert {name: tuple(meta.shape) for name, meta in metas.items()} == {n: tuple(t.shape) for n, t in state.items()}


def test_the_file_is_as_large_as_serializing_the_state(tmp_path: Path) -> None:
    state = {name: t for name, t in _state().items() if name != "layer.transposed"}  # serialize refuses views
    path = tmp_path / "v.safetensors"
    payload = serialize(state, torch.bfloat16)
    size = write_safetensors(state, path, torch.bfloat16)
    assert abs(size - len(payload)) < 64, "the same tensor bytes; only the header's layout may differ"
