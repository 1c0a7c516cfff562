"""One CLI vocabulary (CONTRIBUTING.md, "CLI conventions"), checked on the real `lodestar` parser: every
argument of every command has help; a unified concept (run id, timeouts, service addresses, TLS and token) has
one spelling across commands, and its old spellings are argparse errors (no aliases); every command that
calls a service takes the TLS and token flags; the harness, verifier and runtime names the CLI accepts are
`lodestar/kinds.py`'s."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from lodestar import kinds
from lodestar_app.cli.main import build_parser

Command = tuple[str, argparse.ArgumentParser]

CONCEPTS: dict[str, tuple[str, set[str]]] = {
    "run id": ("--run", {"run", "run_id"}),
    "the command's deadline": ("--timeout-s", {"timeout", "timeout_s", "deadline"}),
    "each start's deadline": ("--start-timeout-s", {"start_timeout", "start_timeout_s"}),
    "a refresh period": ("--interval-s", {"interval", "interval_s"}),
    "rollout address": ("--rollout", {"rollout", "rollout_address"}),
    "gateway address": ("--gateway", {"gateway", "gateway_address"}),
    "inference address": ("--inference", {"inference", "inference_address"}),
    "TLS CA": ("--tls-ca", {"tls_ca", "ca"}),
    "TLS certificate": ("--tls-cert", {"tls_cert"}),
    "TLS key": ("--tls-key", {"tls_key"}),
    "token file": ("--auth-token-file", {"auth_token_file"}),
}
"""The unified concepts: the one option string every command spells each with, and the destinations (old
and new) an option for it parses into. Positional arguments (`run status RUN_ID`) are not options."""

RETIRED = {"--run-id", "--timeout", "--start-timeout", "--deadline", "--interval", "--rollout-address"}
"""Old spellings of those concepts: no command accepts them."""
OLD_SPELLINGS = [
    ("lodestar up", "--timeout"),
    ("lodestar eval", "--timeout"),
    ("lodestar eval", "--start-timeout"),
    ("lodestar health", "--timeout"),
    ("lodestar session open", "--run-id"),
    ("lodestar session show", "--timeout"),
    ("lodestar run status", "--interval"),
]
"""The seven deprecated aliases removed in 0.1.0 (a release with no users), one per command that had one
(`session ... --timeout` stands for every session subcommand)."""

CLIENT_SECURITY = {"--tls-ca", "--tls-cert", "--tls-key", "--auth-token-file"}


def _commands(parser: argparse.ArgumentParser, path: str = "lodestar") -> Iterator[Command]:
    """Every leaf command (one that has a handler) with its parser."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, child in action.choices.items():
            yield from _commands(child, f"{path} {name}")


COMMANDS = list(_commands(build_parser()))


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholder words for the arguments `parser` requires."""
    words: list[str] = []
    for action in parser._actions:
        if action.required:
            value = sorted(action.choices)[0] if action.choices else "x"
            words += [*action.option_strings[:1], value]
    return words


def test_the_walk_finds_every_command() -> None:
    names = {name for name, _ in COMMANDS}
    assert {"lodestar up", "lodestar run status", "lodestar session open", "lodestar train", "lodestar eval"} <= names
    assert "lodestar trainer serve" in names


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_argument_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in _visible(parser) if not a.help]
    assert not missing, f"`{name}`: no help on {missing}"


def test_a_unified_concept_has_one_spelling_across_commands() -> None:
    wrong: list[str] = []
    seen: set[str] = set()
    for name, parser in COMMANDS:
        for action in _visible(parser):
            for concept, (flag, dests) in CONCEPTS.items():
                if action.option_strings and action.dest in dests:
                    seen.add(concept)
                    if action.option_strings != [flag]:
                        wrong.append(f"{name} {'/'.join(action.option_strings)} ({concept}: {flag})")
            wrong += [f"{name} {flag} (retired)" for flag in action.option_strings if flag in RETIRED]
    assert not wrong, f"one concept, several spellings: {wrong}"
    assert set(CONCEPTS) == seen


def test_no_command_accepts_an_old_spelling() -> None:
    accepting = [
        f"{name} {flag}" for name, parser in COMMANDS for flag in parser._option_string_actions if flag in RETIRED
    ]
    assert not accepting


@pytest.mark.parametrize(("name", "flag"), OLD_SPELLINGS, ids=[f"{n} {f}" for n, f in OLD_SPELLINGS])
def test_an_old_spelling_is_an_argparse_error(name: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = dict(COMMANDS)[name]
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([*_required(parser), flag, "7"])
    assert exited.value.code == 2
    assert f"unrecognized arguments: {flag} 7" in capsys.readouterr().err


def _calls_a_service(name: str, parser: argparse.ArgumentParser) -> bool:
    if name.endswith(" serve"):  # a service: its own settings carry the same flags
        return False
    addresses = any(_option(parser, flag) for flag in ("--rollout", "--gateway", "--inference"))
    return addresses or name in ("lodestar health", "lodestar train")


def test_every_command_that_calls_a_service_takes_the_tls_and_token_flags() -> None:
    clients = {name: parser for name, parser in COMMANDS if _calls_a_service(name, parser)}
    assert {"lodestar train", "lodestar session show", "lodestar run status", "lodestar eval"} <= set(clients)
    lacking = {name: sorted(f for f in CLIENT_SECURITY if not _option(p, f)) for name, p in clients.items()}
    assert not {name: flags for name, flags in lacking.items() if flags}


def _choices(dest: str) -> list[tuple[str, list[str] | None]]:
    """(command, the choices it accepts) of every option parsing into `dest`."""
    return [
        (name, None if action.choices is None else list(action.choices))
        for name, parser in COMMANDS
        for action in _visible(parser)
        if action.dest == dest and action.option_strings
    ]


def test_kind_names_are_the_ones_in_kinds() -> None:
    accepted = {"harness": kinds.harness_kinds(), "verifier": kinds.VERIFIER_KINDS, "runtime": kinds.RUNTIME_KINDS}
    assert _choices("harness"), "no command takes --harness"
    for dest, names in accepted.items():
        for name, choices in _choices(dest):
            assert choices == list(names), f"`{name} --{dest}` accepts {choices}, lodestar/kinds.py has {names}"
