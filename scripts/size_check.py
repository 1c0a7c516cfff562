"""The size limits of the house (files <= 600 lines, functions <= 80 lines), checked over our own Python code.

Our code: `lodestar/` (the generated `lodestar/v1` excluded), `lodestar_app/`, each service's package
(`services/<name>/lodestar_<name>/`), `bench/`, `scripts/` and `tests/`. A function's length runs from its
`def` line to its last line (docstring and nested functions included); a nested function is also measured
on its own.

Usage: `.venv/bin/python scripts/size_check.py [ROOT]` prints each offender as `path:line name (N lines)`
and exits 1 when there is one (`make sizes`, part of `make check` and `make test`).
tests/kernel/test_size_check.py checks the checker on a synthetic tree.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
TOP_DIRS = ("lodestar", "lodestar_app", "bench", "scripts", "tests")
SERVICE_GLOB = "services/*/lodestar_*"
EXCLUDED = ("lodestar/v1",)
"""Generated code (protobuf), never edited, so never measured."""


@dataclass(frozen=True)
class Offender:
    """One file or function over its limit."""

    path: str
    line: int
    name: str
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def our_files(root: Path) -> Iterator[Path]:
    """Every Python file of ours under `root`, in a stable order."""
    dirs = [root / name for name in TOP_DIRS] + sorted(root.glob(SERVICE_GLOB))
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative == ex or relative.startswith(ex + "/") for ex in EXCLUDED):
                continue
            yield path


def offenders_in(path: Path, relative: str) -> Iterator[Offender]:
    """The file itself when it is over the file limit, then each function over the function limit."""
    source = path.read_text(encoding="utf-8")
    file_lines = len(source.splitlines())
    if file_lines > MAX_FILE_LINES:
        yield Offender(relative, 1, "(file)", file_lines)
    for node in ast.walk(ast.parse(source, filename=relative)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                yield Offender(relative, node.lineno, node.name, lines)


def offenders(root: Path) -> list[Offender]:
    """All offenders under `root`, sorted by path and line."""
    found = [offender for path in our_files(root) for offender in offenders_in(path, path.relative_to(root).as_posix())]
    return sorted(found, key=lambda o: (o.path, o.line))


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    found = offenders(root)
    for offender in found:
        print(offender)
    if found:
        print(
            f"{len(found)} over the limits (files <= {MAX_FILE_LINES} lines, functions <= {MAX_FUNCTION_LINES})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
