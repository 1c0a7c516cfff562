"""`lodestar train`'s `[train]` keys that pick how the stack it starts serves: `vllm_lora` is passed to the
vllm backend as given, and a value or a backend it cannot apply to is refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar_app.cli.train_config import load_train_config


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.toml"
    path.write_text('[train]\nspec = "run.yaml"\nsteps = 3\n' + body)
    return path


def test_vllm_lora_is_unset_by_default_and_taken_with_the_vllm_backend(tmp_path: Path) -> None:
    assert load_train_config(_write(tmp_path, 'backend = "vllm"\n')).vllm_lora is None
    config = load_train_config(_write(tmp_path, 'backend = "vllm"\nvllm_lora = "native"\n'))
    assert config.vllm_lora == "native"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('backend = "vllm"\nvllm_lora = "fused"\n', 'vllm_lora must be "merge" or "native", not \'fused\''),
        ('vllm_lora = "native"\n', 'vllm_lora needs backend = "vllm"'),
        ('backend = "transformers"\nvllm_lora = "merge"\n', 'vllm_lora needs backend = "vllm"'),
    ],
)
def test_a_vllm_lora_it_cannot_apply_is_refused(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"\\[train\\] {message}"):
        load_train_config(_write(tmp_path, body))
