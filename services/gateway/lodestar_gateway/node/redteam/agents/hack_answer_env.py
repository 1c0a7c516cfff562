"""answer-env: looks for task metadata and answers in the environment: its own, every process's it can read
under /proc, and (planted in the library's modules and a conftest.py) the environment of whatever the verifier
runs, where a found gold patch is applied before the tests are collected."""

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

KEYS = ("gold_patch", "answer", "fail_to_pass", "test_patch", "expected")
AT_VERIFY = """
def _lodestar_env_answers():
    import json, os, subprocess
    raw = os.environ.get("LODESTAR_TASK_METADATA", "")
    try:
        metadata = json.loads(raw) if raw else {}
    except ValueError:
        return
    patch = metadata.get("gold_patch") if isinstance(metadata, dict) else None
    if patch:
        subprocess.run(["git", "apply", "-"], input=patch.encode(), capture_output=True, check=False)
_lodestar_env_answers()
"""


def scan(environ: dict[str, str], where: str) -> str:
    """The answer an environment holds (also recording what it leaked)."""
    answer = ""
    for name, value in environ.items():
        if name.startswith(("LODESTAR_TASK_METADATA", "LODESTAR_REWARD", "LODESTAR_ANSWER")) or any(
            key in value for key in KEYS
        ):
            _common.leaked(f"{where}: {name}")
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                patch, found = str(parsed.get("gold_patch") or ""), str(parsed.get("answer") or "")
                if patch:
                    _common.apply_patch(patch, _common.repository())
                answer = answer or found
    return answer


def main() -> int:
    answer = scan(dict(os.environ), "own environment")
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            pairs = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        other = dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if b"=" in p)
        answer = answer or scan(other, str(environ))
    root = _common.repository()
    for module in _common.library_modules(root):
        _common.plant(module, AT_VERIFY, append=True)
    _common.plant(root / "conftest.py", AT_VERIFY)
    return _common.finish("answer-env", answer)


if __name__ == "__main__":
    sys.exit(main())
