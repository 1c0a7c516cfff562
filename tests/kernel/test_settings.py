"""Settings precedence (flags > env > TOML file > defaults), validation errors, and generated CLI flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lodestar import errors
from lodestar.settings import load_settings
from lodestar_app.cli.flags import add_settings_arguments, flags_from_args
from lodestar_app.cli.main import build_parser
from lodestar_gateway.settings import GatewaySettings
from lodestar_inference.settings import InferenceSettings
from lodestar_rollout.settings import RolloutSettings


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "lodestar.toml"
    path.write_text(
        """
[rollout]
port = 6001
etcd = "http://10.0.0.1:2379"
store = "/from/file.sqlite"

[trainer]
port = 7001
"""
    )
    return path


def test_defaults_when_nothing_is_given() -> None:
    settings = load_settings(RolloutSettings, env={})
    assert settings.port == 50053
    assert settings.etcd == "http://127.0.0.1:2379"
    assert settings.store == ".lodestar/rollout.sqlite"
    assert settings.host == "127.0.0.1"
    assert settings.drain_seconds == 10.0


def test_each_layer_overrides_the_one_below(config_file: Path) -> None:
    from_file = load_settings(RolloutSettings, env={}, config_file=config_file)
    assert (from_file.port, from_file.etcd, from_file.store) == (6001, "http://10.0.0.1:2379", "/from/file.sqlite")
    assert from_file.host == "127.0.0.1"  # not in the file: default

    env = {"LODESTAR_ROLLOUT_PORT": "6002", "LODESTAR_ROLLOUT_DRAIN_SECONDS": "2.5", "LODESTAR_TRAINER_PORT": "1"}
    from_env = load_settings(RolloutSettings, env=env, config_file=config_file)
    assert from_env.port == 6002  # env beats file
    assert from_env.drain_seconds == 2.5  # env beats default
    assert from_env.etcd == "http://10.0.0.1:2379"  # file still applies where env is silent

    flags = {"port": 6003, "etcd": None, "store": "/from/flag.sqlite"}
    from_flags = load_settings(RolloutSettings, flags=flags, env=env, config_file=config_file)
    assert from_flags.port == 6003  # flag beats env
    assert from_flags.store == "/from/flag.sqlite"  # flag beats file
    assert from_flags.etcd == "http://10.0.0.1:2379"  # a None flag means "not given"


def test_config_file_from_environment(config_file: Path, tmp_path: Path) -> None:
    settings = load_settings(RolloutSettings, env={"LODESTAR_CONFIG": str(config_file)})
    assert settings.port == 6001
    other = tmp_path / "other.toml"
    other.write_text("[rollout]\nport = 6100\n")
    explicit = load_settings(RolloutSettings, env={"LODESTAR_CONFIG": str(config_file)}, config_file=other)
    assert explicit.port == 6100  # an explicit --config wins over $LODESTAR_CONFIG


def test_sections_are_separate(config_file: Path) -> None:
    assert load_settings(GatewaySettings, env={}, config_file=config_file).port == 50052


def test_env_booleans_and_none_defaults() -> None:
    settings = load_settings(GatewaySettings, env={"LODESTAR_GATEWAY_LOG_JSON": "false"})
    assert settings.log_json is False
    assert settings.rollout is None
    settings = load_settings(GatewaySettings, env={"LODESTAR_GATEWAY_ROLLOUT": "127.0.0.1:9"})
    assert settings.rollout == "127.0.0.1:9"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"LODESTAR_ROLLOUT_PORT": "not-a-port"}, "port"),
        ({"LODESTAR_ROLLOUT_DRAIN_SECONDS": "soon"}, "drain_seconds"),
        ({"LODESTAR_ROLLOUT_LOG_JSON": "perhaps"}, "log_json"),
        ({"LODESTAR_ROLLOUT_PORT": ""}, "port"),
        ({"LODESTAR_ROLLOUT_PORT": "[1,"}, "port"),
    ],
)
def test_bad_env_values_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=rf"rollout.*\b{field}\b"):
        load_settings(RolloutSettings, env=env)


def test_bad_literal_names_the_field() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="backend"):
        load_settings(InferenceSettings, env={"LODESTAR_INFERENCE_BACKEND": "magic"})


def test_bad_config_files(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text('[rollout]\ndatbase = "x.sqlite"\n')
    with pytest.raises(errors.InvalidArgumentError, match="datbase"):
        load_settings(RolloutSettings, env={}, config_file=typo)

    wrong_type = tmp_path / "wrong.toml"
    wrong_type.write_text('[rollout]\nport = "fifty"\n')
    with pytest.raises(errors.InvalidArgumentError, match="port"):
        load_settings(RolloutSettings, env={}, config_file=wrong_type)

    not_toml = tmp_path / "broken.toml"
    not_toml.write_text("[rollout\nport = 1\n")
    with pytest.raises(errors.InvalidArgumentError, match="not valid TOML"):
        load_settings(RolloutSettings, env={}, config_file=not_toml)

    not_a_table = tmp_path / "scalar.toml"
    not_a_table.write_text("rollout = 3\n")
    with pytest.raises(errors.InvalidArgumentError, match=r"\[rollout\] must be a table"):
        load_settings(RolloutSettings, env={}, config_file=not_a_table)

    with pytest.raises(errors.InvalidArgumentError, match="cannot read config file"):
        load_settings(RolloutSettings, env={}, config_file=tmp_path / "missing.toml")


def test_settings_are_frozen() -> None:
    settings = load_settings(RolloutSettings, env={})
    with pytest.raises(ValueError, match="frozen"):
        settings.port = 1  # type: ignore[misc]


def _parser(settings_class) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, settings_class)
    return parser


def test_flags_are_generated_from_fields() -> None:
    parser = _parser(InferenceSettings)
    help_text = parser.format_help()
    for flag in ("--port", "--host", "--drain-seconds", "--backend", "--max-new-tokens", "--log-json", "--config"):
        assert flag in help_text
    assert "--no-log-json" in help_text
    assert "Server-side cap on new tokens" in help_text  # the field docstring is the help

    args = parser.parse_args(["--port", "7", "--backend", "scripted", "--model", "/m", "--no-log-json"])
    flags = flags_from_args(args, InferenceSettings)
    assert flags == {"port": 7, "backend": "scripted", "model": Path("/m"), "log_json": False}
    assert flags_from_args(parser.parse_args([]), InferenceSettings) == {}

    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "magic"])  # Literal fields become choices
    with pytest.raises(SystemExit):
        parser.parse_args(["--port", "seven"])


def test_flags_beat_env_and_file_end_to_end(config_file: Path) -> None:
    """What `lodestar rollout serve` does: parse flags, then layer them over env and the config file."""
    args = build_parser().parse_args(["rollout", "serve", "--config", str(config_file), "--etcd", "http://e:1"])
    settings = load_settings(
        RolloutSettings,
        flags=flags_from_args(args, RolloutSettings),
        env={"LODESTAR_ROLLOUT_ETCD": "http://env:1", "LODESTAR_ROLLOUT_PORT": "6002"},
        config_file=args.config,
    )
    assert settings.etcd == "http://e:1"
    assert settings.port == 6002
    assert settings.store == "/from/file.sqlite"
