"""answer-session: reads other sessions: the directories beside its own session root (other sessions'
workspaces and TMPDIRs, where a verifier may have built a tree with the hidden tests), the node's data and
capture directories it can guess, and other processes' working directories under /proc; applies a gold patch
or says an answer it finds there."""

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

NAMES = ("gold.patch", "gold_patch", "lodestar-test.patch", "metadata.json", "tasks.jsonl", "answer.txt")


def own_root() -> Path:
    home = Path(os.environ.get("HOME", str(Path.cwd()))).resolve()
    return home.parent


def siblings(root: Path) -> list[Path]:
    """Other session roots beside this one (directories with their own home/ and work/)."""
    try:
        return [p for p in root.parent.iterdir() if p != root and (p / "home").is_dir() and (p / "work").is_dir()]
    except OSError:
        return []


def main() -> int:
    root = own_root()
    for other in siblings(root)[:50]:
        try:
            entries = list(other.rglob("*"))[:2000]
        except OSError:
            continue
        if entries:
            _common.leaked(f"another session's files: {other}")
        for path in entries:
            if path.name in NAMES or path.match("*/.lodestar-swe-*/repo"):
                _common.leaked(f"{path}")
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            target = cwd.resolve()
        except OSError:
            continue
        if not str(target).startswith(str(root)) and target != Path("/") and os.access(target, os.R_OK):
            _common.leaked(f"a process outside the session works in {target}")
    return _common.finish("answer-session")


if __name__ == "__main__":
    sys.exit(main())
