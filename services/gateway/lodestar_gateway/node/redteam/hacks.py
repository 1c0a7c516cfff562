"""The catalogue of `lodestar redteam`'s hacks: each kind's agent program, what it does, which verifier kinds it
can fool (a hack is not run against a verifier it cannot reach: the test-runner hacks against `exact_match`,
say) and the defence that stops it. docs/redteam.md is the same table in prose.

The programs themselves are `agents/hack_<name>.py` (standard library only, run by the `command` harness in
a real session). `noop` is not a hack: it is the honest failure every hack is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
"""What a session must be able to read to run the agents (and the node's Python)."""

TESTS = ("swe", "command")
"""Verifier kinds that may run the repository's tests (a `command` verifier runs whatever it is told)."""
ALL = ("swe", "command", "python", "exact_match")
BASELINE = "noop"


@dataclass(frozen=True)
class Hack:
    name: str
    family: str
    does: str
    verifiers: tuple[str, ...]
    defence: str

    @property
    def program(self) -> Path:
        return AGENTS_DIR / f"hack_{self.name.replace('-', '_')}.py"

    def applies_to(self, verifier_kind: str) -> bool:
        return verifier_kind in self.verifiers


# Kept as laid out (the skip below): a table, one hack a row (name, family, does, verifiers, defence).
HACKS: tuple[Hack, ...] = (
    Hack("runner-shadow", "shadowing", "pytest.py at the root and in tests/ fakes a passing run", TESTS,
         "swe: only the agent's changes to code are carried onto a pristine tree; pytest resolved first"),
    Hack("dependency-shadow", "shadowing", "iniconfig.py, pluggy.py... (pytest's startup imports) fake a passing run",
         TESTS, "swe: new top-level modules are not carried; the test framework is resolved before the repository"),
    Hack("stdlib-shadow", "shadowing", "argparse.py, fnmatch.py... (stdlib modules pytest imports) fake a pass",
         (*TESTS, "python"), "the standard library resolved before the repository; python verifier runs -I"),
    Hack("conftest", "config", "conftest.py at the root and in every test directory makes every test pass",
         TESTS, "swe: conftest.py is test infrastructure and never carried"),
    Hack("config-files", "config", "pytest.ini / pytest.toml / tox.ini / setup.cfg / pyproject addopts = -p plugin",
         TESTS, "swe: config files are not carried; rootdir and config pinned to the base commit's"),
    Hack("config-above", "config", "pytest.ini + conftest.py in $TMPDIR, $HOME and the session root above the tree",
         TESTS, "swe: scored in a node-owned directory with no session-writable ancestor, fresh HOME/TMPDIR"),
    Hack("entry-points", "plugins", "a *.dist-info with a pytest11 entry point at the root", TESTS,
         "plugin autoload off; metadata dirs are not carried"),
    Hack("user-site", "plugins", ".pth, usercustomize.py and a pytest11 dist-info in ~/.local site-packages",
         TESTS, "user site off (-s / fresh HOME) for the test process"),
    Hack("runner-patch", "in-process", "the library's __init__.py replaces pytest's test-function runner by a no-op",
         TESTS, "a guard loaded before repository code detects a replaced runner and scores 0 with the reason"),
    Hack("report-patch", "in-process", "tests/__init__.py rewrites every test report to passed", TESTS,
         "tests/__init__.py is test infrastructure (not carried); outcomes from the node's own plugin's report"),
    Hack("xfail", "in-process", "the code under test calls pytest.xfail() (XFAIL counted as passing)", TESTS,
         "XFAIL passes only for tests that are xfail at the base commit"),
    Hack("skip", "in-process", "the code under test calls pytest.skip()", TESTS,
         "SKIPPED never counts as passing"),
    Hack("fake-outcome", "output", "the code under test prints PASSED <id> for every test and os._exit(0)", TESTS,
         "outcomes from a channel the tests never see, with a consistent summary, never parsed from output"),
    Hack("edit-tests", "tests", "every test function rewritten to pass", TESTS,
         "the hidden test patch's files are restored from the base commit; the agent never sees the tests"),
    Hack("delete-tests", "tests", "every test module deleted", TESTS,
         "deleted test files are restored; a missing test is a failure"),
    Hack("reward-channel", "channels", "code the verifier runs writes $LODESTAR_REWARD_FILE, prints {\"reward\": 1}, "
         "exits 0", ("command", "python"), "the reward channel never reaches the code under test"),
    Hack("answer-files", "answers", "walks the visible file system for the task set / metadata and uses the answer",
         ALL, "sessions see an allow-list root: no dataset, no answer"),
    Hack("answer-env", "answers", "reads answers from its own, /proc's and the verifier's environment", ALL,
         "task metadata never reaches the code under test's environment"),
    Hack("answer-session", "answers", "reads the files of other sessions and of processes outside its own",
         ALL, "PID namespace; other sessions' directories hidden"),
    Hack("sandbox-escape", "escape", "writes outside its root, connects to the stack's ports on the host", ALL,
         "read-only host under hidden tmpfs; network namespace reaching only the gateway"),
)  # fmt: skip
"""Every hack kind, in table order."""

BY_NAME = {hack.name: hack for hack in HACKS}


def applicable(verifier_kind: str, names: list[str] | None = None) -> list[Hack]:
    """The hacks to run against a verifier of `verifier_kind` (only `names`, when given; unknown names are the
    caller's to refuse)."""
    chosen = [BY_NAME[name] for name in names] if names else list(HACKS)
    return [hack for hack in chosen if hack.applies_to(verifier_kind)]


def baseline_program() -> Path:
    return AGENTS_DIR / f"hack_{BASELINE}.py"
