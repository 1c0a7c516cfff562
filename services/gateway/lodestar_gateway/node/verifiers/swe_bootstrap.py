"""The start of every pytest run of the `swe` verifier: node code that runs before any repository code.

The node copies this file into its scoring directory and runs it in the session's runtime as
`python -I swe_bootstrap.py REPORT NONCE_FILE REPOSITORY -- PYTEST_ARGS...` in the repository directory (it
imports nothing of lodestar: it runs under whatever Python the test environment has). In order:

1. it opens REPORT (a new file in the node's scoring directory, outside the repository), reads the nonce
   from NONCE_FILE and deletes that file (the nonce is never on a command line or in the environment, where
   `/proc/self/cmdline` would show it to the code under test), and hides its arguments from `sys.argv`;
2. with `-I` (no PYTHON* variables, no user site, no script or working directory on `sys.path`) it imports
   pytest, every `_pytest` module, pluggy and pytest's dependencies, so the standard library and the test
   framework are resolved before the repository is on `sys.path`; then it appends the repository and the
   entries of PYTHONPATH (after them: a repository module never shadows one of theirs) and turns plugin
   autoload off;
3. it snapshots the identity of every function and class of pytest and pluggy (and the code of each
   function), runs `pytest.main` with its own plugin (`Recorder`), and compares them at the end, with the
   hook implementations registered after collection started: a replaced test runner or report path is
   written as `tampered` in the summary (the node scores 0);
4. `Recorder` writes one JSON line per test to REPORT (its final status over setup, call and teardown; an
   XFAIL counts only for a test that had a static `xfail` marker when collection ended, never for an
   imperative `pytest.xfail()`), then the bootstrap writes a summary line with the counts, pytest's exit
   code and NONCE, and exits with that code.

A report without its summary (the process died, or the code under test called `os._exit`) has no outcome.
What the code under test can still do from inside the process is in docs/swe.md ("What the verifier cannot
prevent"). Exit 3 with a `setup_failed` line: pytest could not be imported (the environment, not the agent).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import sys
import types
from typing import Any

SETUP_FAILED = 3
DEPENDENCIES = (
    "pluggy",
    "iniconfig",
    "packaging",
    "packaging.version",
    "packaging.requirements",
    "pygments",
    "pygments.lexers.python",
    "pygments.lexers.diff",
    "pygments.formatters.terminal",
    "exceptiongroup",
    "tomli",
    "colorama",
)
STDLIB = (
    "argparse",
    "tempfile",
    "shlex",
    "json",
    "inspect",
    "traceback",
    "warnings",
    "unittest",
    "doctest",
    "pdb",
    "faulthandler",
    "threading",
    "dataclasses",
    "fnmatch",
    "glob",
    "textwrap",
    "difflib",
    "pprint",
    "decimal",
    "fractions",
    "string",
    "tomllib",
    "typing",
    "re",
    "io",
    "logging",
)
WATCHED = ("pytest", "_pytest", "pluggy")


class Report:
    """The JSON-lines channel to the node (an fd opened before any repository code ran)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.write = os.write
        self.dumps = json.dumps

    def emit(self, record: dict[str, Any]) -> None:
        self.write(self.fd, (self.dumps(record, sort_keys=True) + "\n").encode())


def _import_framework() -> None:
    for name in STDLIB:
        _try_import(name)
    import _pytest
    import pytest  # noqa: F401

    for info in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        _try_import(info.name)
    for name in DEPENDENCIES:
        _try_import(name)


def _try_import(name: str) -> None:
    with contextlib.suppress(Exception):  # an optional dependency of this pytest version
        importlib.import_module(name)


def _watched_modules() -> dict[str, Any]:
    return {
        name: module
        for name, module in list(sys.modules.items())
        if isinstance(module, types.ModuleType) and name.split(".")[0] in WATCHED
    }


def _members(module: types.ModuleType) -> dict[str, Any]:
    """name -> (object, code or None) for the functions and classes of `module` and the methods and
    properties of its classes."""
    found: dict[str, tuple[Any, Any]] = {}
    for name, value in list(vars(module).items()):
        if isinstance(value, types.FunctionType):
            found[name] = (value, value.__code__)
        elif isinstance(value, type):
            found[name] = (value, None)
            if value.__module__ == module.__name__:
                for attr, member in list(vars(value).items()):
                    function = getattr(member, "__func__", member)
                    if isinstance(function, types.FunctionType):
                        found[f"{name}.{attr}"] = (member, function.__code__)
                    elif isinstance(member, (property, staticmethod, classmethod)):
                        found[f"{name}.{attr}"] = (member, None)
    return found


class Guard:
    """Identities of pytest's and pluggy's functions, classes and hook implementations (module docstring)."""

    def __init__(self) -> None:
        self.modules = _watched_modules()
        self.members = {name: _members(module) for name, module in self.modules.items()}
        self.hooks: dict[str, Any] = {}
        self.plugins: set[int] = set()

    def session_started(self, config: Any) -> None:
        manager = config.pluginmanager
        self.plugins = {id(plugin) for plugin in manager.get_plugins()}
        self.hooks = {
            name: (caller, caller._hookexec, [(impl, impl.function) for impl in caller.get_hookimpls()])
            for name, caller in vars(manager.hook).items()
        }
        self.inner = manager._inner_hookexec
        self.manager = manager

    def changed(self, repository: str) -> list[str]:
        found = []
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}]")
                continue
            now = _members(module)  # type: ignore[arg-type]
            for member, (value, code) in self.members[name].items():
                current = now.get(member)
                if current is None or current[0] is not value or (code is not None and current[1] is not code):
                    found.append(f"{name}.{member}")
            before = self.members[name]
            added = [key for key in now.keys() - before.keys() if key.split(".")[0] in before]  # to old classes
            found.extend(f"{name}.{member} (added)" for member in sorted(added))
        if self.hooks:
            found.extend(self._hooks_changed(repository))
        return found

    def _hooks_changed(self, repository: str) -> list[str]:
        manager, found = self.manager, []
        if manager._inner_hookexec != self.inner:
            found.append("pluginmanager._inner_hookexec")
        for name, caller in vars(manager.hook).items():
            before = self.hooks.get(name)
            if before is not None and (caller is not before[0] or caller._hookexec != before[1]):
                found.append(f"hook.{name}")
                continue
            for impl, function in before[2] if before else []:
                if impl.function is not function:
                    found.append(f"hook.{name} ({impl.plugin_name})")
            for impl in caller.get_hookimpls():
                if id(impl.plugin) in self.plugins:
                    continue
                source = getattr(getattr(impl.function, "__code__", None), "co_filename", "")
                inside = os.path.realpath(source).startswith(repository + os.sep)
                if inside and os.path.basename(source) != "conftest.py":
                    found.append(f"hook.{name} ({impl.plugin_name}, from {source})")
        return found


def _status(report: Any, previous: str | None) -> str | None:
    """A test's status after one more of its reports (setup, call, teardown)."""
    when, outcome = report.when, report.outcome
    xfailed = hasattr(report, "wasxfail")
    if outcome == "failed":
        return "failed" if when == "call" else "error"
    if when == "teardown":
        return previous
    if outcome == "skipped":
        return "xfail" if xfailed else "skipped"
    if when == "call":
        return "xpass" if xfailed else "passed"
    return previous


def make_recorder(report: Report, guard: Guard) -> Any:
    import pytest
    from _pytest.outcomes import XFailed

    class Recorder:
        """The node's plugin: per-test statuses to the report (module docstring)."""

        def __init__(self) -> None:
            self.status: dict[str, str | None] = {}
            self.static_xfail: set[str] = set()
            self.imperative: set[str] = set()
            self.counts: dict[str, int] = {}
            self.collect_errors = 0

        @pytest.hookimpl(tryfirst=True)
        def pytest_collection(self, session: Any) -> None:
            guard.session_started(session.config)

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session: Any) -> None:
            for item in session.items:
                if item.get_closest_marker("xfail") is not None:
                    self.static_xfail.add(item.nodeid)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
            yield
            excinfo = call.excinfo
            if excinfo is None or not isinstance(excinfo.value, XFailed):
                return
            if call.when != "setup" or not str(excinfo.value.msg).startswith("[NOTRUN]"):  # not xfail(run=False)
                self.imperative.add(item.nodeid)

        def pytest_collectreport(self, report: Any) -> None:
            if report.failed:
                self.collect_errors += 1
                emit({"event": "collect_error", "id": report.nodeid})

        @pytest.hookimpl(trylast=True)
        def pytest_runtest_logreport(self, report: Any) -> None:
            nodeid = report.nodeid
            self.status[nodeid] = _status(report, self.status.get(nodeid))
            if report.when != "teardown":
                return
            status = self.status.pop(nodeid) or "error"
            if status == "xfail" and (nodeid not in self.static_xfail or nodeid in self.imperative):
                status = "xfail_not_at_base"
            self.counts[status] = self.counts.get(status, 0) + 1
            emit({"event": "test", "id": nodeid, "status": status})

    emit = report.emit
    return Recorder()


def main() -> None:
    report_path, nonce_path, repository = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
    args = sys.argv[5:]
    with open(nonce_path) as handle:
        nonce = handle.read().strip()
    os.unlink(nonce_path)
    report = Report(os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    sys.argv = [sys.argv[0]]
    sys.dont_write_bytecode = True
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_PLUGINS", None)
    try:
        _import_framework()
        import pytest
    except Exception as error:
        report.emit({"event": "setup_failed", "error": f"{type(error).__name__}: {error}"})
        sys.exit(SETUP_FAILED)
    guard = Guard()
    changed, emit, exit_now = guard.changed, report.emit, os._exit
    recorder = make_recorder(report, guard)
    # After the framework: the repository (as `python -m pytest` has its working directory), then the
    # entries of PYTHONPATH (the task's or the verifier config's: `-I` ignores the variable itself).
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path.extend([repository, *(os.path.join(repository, entry) for entry in entries)])
    emit({"event": "started", "pytest": pytest.__version__})
    code = int(pytest.main(args, plugins=[recorder]))
    tampered = changed(repository)
    summary = {
        "event": "summary",
        "nonce": nonce,
        "exit": code,
        "counts": recorder.counts,
        "collect_errors": recorder.collect_errors,
        "tampered": tampered,
    }
    emit(summary)
    sys.stdout.flush()
    sys.stderr.flush()
    exit_now(code)


if __name__ == "__main__":
    main()
