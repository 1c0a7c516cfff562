"""The commands the README and the quickstart show are commands lodestar and the Makefile accept: every `lodestar
...` line of their bash blocks parses with the real CLI parser (subcommands, flags, choices), and every `make X`
names a Makefile target; files under examples/ they name exist. Placeholders such as RUN_ID or DIR stand in
for values; nothing is run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lodestar_app.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/quickstart.md"]


def _commands(path: Path) -> list[str]:
    """Shell commands of the file's ```bash blocks (continuations joined; `$(...)` bodies as commands too)."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            commands += re.findall(r"\$\(([^()]*)\)", line)
            commands += [part.strip() for part in re.split(r"&&|\|\||;|\|", line)]
    return [command for command in commands if command]


def _words(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # leading VAR=value assignments
        words.pop(0)
    return words


def _cases() -> list[tuple[str, list[str]]]:
    return [(doc, words) for doc in DOCS for words in map(_words, _commands(REPO / doc)) if words]


def test_the_docs_show_commands() -> None:
    programs = {words[0] for _, words in _cases()}
    assert {"lodestar", "make"} <= programs


LODESTAR_CASES = [case for case in _cases() if case[1][0] == "lodestar"]


@pytest.mark.parametrize(
    ("doc", "words"), LODESTAR_CASES, ids=[f"{doc}: {' '.join(words)}"[:70] for doc, words in LODESTAR_CASES]
)
def test_lodestar_commands_parse(doc: str, words: list[str]) -> None:
    try:
        build_parser().parse_args(words[1:])
    except SystemExit as error:
        pytest.fail(f"{doc}: `{' '.join(words)}` is refused by the CLI (exit {error.code})")
    shipped = [word for word in words if word.startswith("examples/")]
    assert all((REPO / word).exists() for word in shipped), f"{doc}: `{' '.join(words)}` names a missing file"


def test_make_targets_exist() -> None:
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))
    for doc, words in _cases():
        if words[0] == "make":
            missing = [target for target in words[1:] if not target.startswith("-") and target not in targets]
            assert not missing, f"{doc}: `{' '.join(words)}` names no Makefile target {missing}"
