"""The trainer's settings in sections: a section's fields come from `[trainer.<section>]`, `--<section>.<field>`
and `LODESTAR_TRAINER_<SECTION>__<FIELD>`, merged field by field across the layers; every flat key of the
earlier layout is refused wherever it is given, with its new place in the error."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.settings import load_settings
from lodestar_app.cli.flags import add_settings_arguments, flags_from_args
from lodestar_trainer.settings import MOVED, TrainerSettings

NEW_PLACE = "`micro_batch_tokens` has moved to `batch.micro_batch_tokens`"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lodestar trainer serve", exit_on_error=False)
    add_settings_arguments(parser, TrainerSettings)
    return parser


def test_sections_merge_field_by_field_across_file_env_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    tables = ['[trainer]\nrun = "r"\n', "[trainer.batch]\ngroups_per_step = 4\nmicro_batch_tokens = 1024\n"]
    config.write_text("".join([*tables, "[trainer.optimizer]\nlr = 0.1\n"]))
    env = {"LODESTAR_TRAINER_BATCH__MICRO_BATCH_TOKENS": "2048", "LODESTAR_TRAINER_OPTIMIZER__WEIGHT_DECAY": "0.01"}
    args = _parser().parse_args(["--optimizer.lr", "0.5", "--checkpoints.every", "3"])
    flags = flags_from_args(args, TrainerSettings)
    settings = load_settings(TrainerSettings, flags=flags, env=env, config_file=config)
    assert (settings.batch.groups_per_step, settings.batch.micro_batch_tokens) == (4, 2048)
    assert (settings.optimizer.lr, settings.optimizer.weight_decay) == (0.5, 0.01)
    assert (settings.checkpoints.every, settings.run) == (3, "r")
    assert settings.checkpoint_dir() == settings.run_dir / "checkpoints"


def test_a_flat_key_in_the_file_is_refused_with_its_new_place(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[trainer]\nmicro_batch_tokens = 1024\n")
    with pytest.raises(InvalidArgumentError, match=NEW_PLACE) as refused:
        load_settings(TrainerSettings, env={}, config_file=config)
    assert "[trainer.batch]" in refused.value.message


def test_a_flat_environment_variable_is_refused_with_its_new_place() -> None:
    env = {"LODESTAR_TRAINER_MICRO_BATCH_TOKENS": "1024"}
    with pytest.raises(InvalidArgumentError, match=NEW_PLACE) as refused:
        load_settings(TrainerSettings, env=env)
    assert "LODESTAR_TRAINER_BATCH__MICRO_BATCH_TOKENS" in refused.value.message


def test_a_flat_flag_is_refused_with_its_new_place(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--micro-batch-tokens", "1024"])
    assert "--batch.micro-batch-tokens" in capsys.readouterr().err


@pytest.mark.parametrize("key", sorted(MOVED))
def test_every_flat_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match=f"`{key}` has moved to `{MOVED[key]}`"):
        TrainerSettings.model_validate({key: 1})


@pytest.mark.parametrize(
    ("device", "dtype", "expected"),
    [("cpu", None, "float32"), ("cuda", None, "bfloat16"), ("cuda:1", None, "bfloat16"),
     ("cuda", "float32", "float32"), ("cpu", "bfloat16", "bfloat16")],
)  # fmt: skip
def test_the_compute_dtype_defaults_by_device(device: str, dtype: str | None, expected: str) -> None:
    """Unset, the compute dtype is bf16 on CUDA (issue 43: fp32 flex runs several times slower there) and fp32
    elsewhere; a set one is kept."""
    compute: dict[str, str] = {"device": device} | ({"dtype": dtype} if dtype else {})
    settings = load_settings(TrainerSettings, flags={"compute": compute})
    assert settings.compute.compute_dtype() == expected
