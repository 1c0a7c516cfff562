#!/usr/bin/env python3
"""Build the swe-mini task set from `repos.py`: one git bundle per repository (`repos/<name>.bundle`, the base
commit only: no fix, no hidden test) and `tasks.jsonl` (one lodestar `Task` with a `repository` per line).

    python examples/swe-mini/make_tasks.py            # (re)write repos/*.bundle and tasks.jsonl
    python examples/swe-mini/make_tasks.py --check    # exit 1 if tasks.jsonl is not what this script makes

Deterministic: fixed author, committer and dates, so the base commits (and the test and gold patches) are
the same on every machine; the bundle files themselves may differ in bytes across git versions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from repos import REPOS, MiniRepo  # noqa: E402

# The swe-mini tests need no pytest plugin: not loading those of the environment (on the host runtime, the
# node's own virtualenv) makes each run ~1.5 s faster.
TEST_COMMAND = [
    "env",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
    "python",
    "-m",
    "pytest",
    "-rA",
    "-p",
    "no:cacheprovider",
    "{tests}",
]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "lodestar",
    "GIT_AUTHOR_EMAIL": "swe-mini@lodestar.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "lodestar",
    "GIT_COMMITTER_EMAIL": "swe-mini@lodestar.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
PROMPT_SUFFIX = (
    " The repository is your working directory. Fix the bug in the library code; do not change the tests "
    "(they are run again, with more tests, after you finish)."
)


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


def _diff(root: Path, files: dict[str, str]) -> str:
    """The unified diff (git format) from the committed tree to the tree with `files` written; then undone."""
    _write(root, files)
    patch = git(root, "diff", "--no-color", "--no-ext-diff")
    git(root, "checkout", "--quiet", "--", ".")
    return patch


def build_repo(repo: MiniRepo, work: Path, bundle: Path) -> dict[str, Any]:
    """The repository of `repo` at its base commit as a bundle at `bundle`; returns its Task (JSON mapping)."""
    root = work / repo.name
    root.mkdir(parents=True)
    test_file = f"tests/test_{repo.name}.py"
    _write(
        root,
        {
            "README.md": f"# {repo.name}\n\nA tiny library of the lodestar swe-mini set. Tests: `python -m pytest`.\n",
            f"{repo.name}/__init__.py": repo.buggy,
            test_file: repo.visible_test,
        },
    )
    git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", f"{repo.name}: initial version")
    base_commit = git(root, "rev-parse", "HEAD").strip()
    test_patch = _diff(root, {test_file: repo.visible_test + repo.hidden_test})
    gold_patch = _diff(root, {f"{repo.name}/__init__.py": repo.fixed})
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.unlink(missing_ok=True)
    git(root, "bundle", "create", "--quiet", str(bundle), "HEAD", "main")
    return {
        "task_id": f"swe-mini-{repo.name}",
        "prompt": repo.prompt + PROMPT_SUFFIX,
        "repository": {
            "source": f"repos/{repo.name}.bundle",
            "base_commit": base_commit,
            "fail_to_pass": [f"{test_file}::{repo.failing}"],
            "pass_to_pass": [f"{test_file}::{repo.passing}"],
            "test_command": TEST_COMMAND,
            "test_patch": test_patch,
            "instance_id": f"swe-mini__{repo.name}-1",
        },
        "metadata": {"gold_patch": gold_patch},
    }


def build(out_dir: Path) -> str:
    """Write the bundles under `out_dir/repos/`; return the text of tasks.jsonl."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="swe-mini-") as scratch:
        for repo in REPOS:
            task = build_repo(repo, Path(scratch), out_dir / "repos" / f"{repo.name}.bundle")
            lines.append(json.dumps(task, sort_keys=True))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed tasks.jsonl only")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory(prefix="swe-mini-check-") as out:
            made = build(Path(out))
        current = (HERE / "tasks.jsonl").read_text(encoding="utf-8")
        if made != current:
            print("tasks.jsonl differs from what make_tasks.py builds: run it again", file=sys.stderr)
            return 1
        print(f"tasks.jsonl is up to date ({len(REPOS)} tasks)")
        return 0
    shutil.rmtree(HERE / "repos", ignore_errors=True)
    (HERE / "tasks.jsonl").write_text(build(HERE), encoding="utf-8")
    print(f"wrote {len(REPOS)} bundles under {HERE / 'repos'} and {HERE / 'tasks.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
