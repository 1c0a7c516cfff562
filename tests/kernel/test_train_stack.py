"""`lodestar train`'s TLS and token flags: passed on as given (absolute paths) to the trainer it starts on an
attached stack, and refused when there is no stack to attach to (the one it starts itself is plaintext)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rich.console import Console

from lodestar.errors import InvalidArgumentError
from lodestar_app.cli import client_security, train_stack
from lodestar_app.cli.main import build_parser
from lodestar_app.cli.train_config import TrainConfig


def test_the_flags_given_are_passed_on_with_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["train", "t.toml", "--tls-ca", "ca.pem", "--auth-token-file", "token"])
    assert client_security.given(args) == [
        "--tls-ca",
        str(tmp_path / "ca.pem"),
        "--auth-token-file",
        str(tmp_path / "token"),
    ]
    assert client_security.given(build_parser().parse_args(["train", "t.toml"])) == []


def test_tls_flags_without_a_stack_to_attach_to_are_refused(tmp_path: Path) -> None:
    config = TrainConfig(
        config_path=tmp_path / "t.toml", spec=tmp_path / "run.yaml", steps=1, run_dir=tmp_path, attach="never"
    )
    with pytest.raises(InvalidArgumentError, match="attaching"):
        asyncio.run(train_stack.open_stack(config, Console(), ["--tls-ca", str(tmp_path / "ca.pem")]))
