"""The import rules of docs/architecture.md, checked by walking the AST of every module of the kernel
(`lodestar/`, generated `lodestar/v1` excluded), the application layer (`lodestar_app/`) and the four services
(`services/<name>/lodestar_<name>/`): every `import` and `from ... import`, at any depth (function bodies and
`if TYPE_CHECKING:` blocks included).

- No service imports another service's package (`lodestar_<a>` -> `lodestar_<b>`).
- The kernel (`lodestar`) imports no service, and nothing but the application layer imports the application
  layer (`lodestar_app`: the CLI, the dashboard, the local stack).
- aiohttp, aetcd, vllm and psycopg are imported only by their owner modules (`OWNERS`).
- torch and transformers only in the inference and trainer services (not in the gateway, rollout, the kernel
  or the application layer).
- No import cycle between modules.
- No module under `tests/` imports from a test module (`test_*.py`): helpers two test modules share live in a
  support module of their package (pytest would also collect an imported test twice).

Exceptions are explicit (`EXCEPTIONS`, each with its reason) and must still be needed: an exception that
matches no import fails the test too. The checker itself is tested on a synthetic tree with one violation
of each rule, so a rule that cannot fail would show.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("lodestar_gateway", "lodestar_rollout", "lodestar_inference", "lodestar_trainer")
APP = "lodestar_app"
PACKAGES: dict[str, str] = {
    "lodestar": "lodestar",
    APP: APP,
    **{service: f"services/{service.removeprefix('lodestar_')}/{service}" for service in SERVICES},
}
"""Import package -> its directory under the repository root."""
GENERATED = ("lodestar.v1",)
TESTS = {"tests": "tests"}

OWNERS: dict[str, dict[str, str]] = {
    "aiohttp": {
        "lodestar_gateway.app": "the gateway's vendor-API HTTP routes",
        "lodestar_gateway.server": "serves the gateway's HTTP port",
        "lodestar_app.dashboard.server": "the dashboard's read-only HTTP server (docs/dashboard.md)",
    },
    "aetcd": {"lodestar.etcd": "the etcd wrapper: leases, watches, transactions"},
    "vllm": {
        "lodestar_inference.engines.vllm": "the vLLM engine adapter",
        "lodestar_inference.engines.vllm_worker": "the weight-update extension loaded into vLLM's workers",
        "lodestar_inference.engines.vllm_lora": "vLLM's own LoRA serving of adapter pushes (LoRARequest)",
    },
    "psycopg": {"lodestar_rollout.pgstore": "rollout's PostgreSQL store"},
}
"""Heavy dependency -> its owner modules (and why each owns it)."""
ML_PACKAGES = ("torch", "transformers")
ML_SERVICES = ("lodestar_inference", "lodestar_trainer")

EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) pairs allowed despite a rule, with the reason."""

TEST_IMPORT_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing test module, imported test module) pairs allowed despite the tests rule, with the reason; each
must still be needed."""


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    """The imported module (for `from m import name`: `m.name` when that is a module of the tree, else `m`);
    for a third-party import, the dotted name as written."""
    where: str
    """path:line, for the failure message."""


@dataclass(frozen=True)
class Violation:
    rule: str
    edge: Import

    def __str__(self) -> str:
        return f"{self.edge.where}: {self.edge.importer} imports {self.edge.target}: {self.rule}"


def modules(root: Path, packages: dict[str, str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` (name -> directory) under `root` except
    generated code."""
    found: dict[str, Path] = {}
    for package, directory in packages.items():
        for path in sorted((root / directory).rglob("*.py")):
            parts = [package, *path.relative_to(root / directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not _within(name, GENERATED):
                found[name] = path
    return found


@functools.cache
def imports(root: Path, packages: tuple[tuple[str, str], ...] = tuple(PACKAGES.items())) -> tuple[Import, ...]:
    """Every import statement of the modules of `packages` under `root`, relative imports resolved (read once
    per root)."""
    known = modules(root, dict(packages))
    found: list[Import] = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        where = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                found.append(Import(name, target, f"{where}:{getattr(node, 'lineno', 0)}"))
    return tuple(found)


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        full_names = (f"{base}.{alias.name}" for alias in node.names)
        yield from dict.fromkeys(full if full in known else base for full in full_names)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def _service(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in SERVICES else None


def rule_violations(edge: Import) -> Iterator[str]:
    """The rules `edge` breaks (exceptions not applied)."""
    importer, target = edge.importer, edge.target
    top = target.split(".")[0]
    source_service, target_service = _service(importer), _service(target)
    if source_service and target_service and source_service != target_service:
        yield "a service imports another service"
    if importer.split(".")[0] == "lodestar" and target_service:
        yield "the kernel imports a service"
    if _within(target, (APP,)) and not _within(importer, (APP,)):
        yield "only the application layer imports the application layer"
    owners = OWNERS.get(top)
    if owners is not None and importer not in owners:
        yield f"{top} is imported only by its owners ({', '.join(owners)})"
    if top in ML_PACKAGES and not _within(importer, ML_SERVICES):
        yield f"{top} only in {' and '.join(ML_SERVICES)}"


def violations(root: Path, exceptions: dict[tuple[str, str], str]) -> tuple[list[Violation], set[tuple[str, str]]]:
    """The rule violations of the tree under `root` that no exception allows, and the exceptions used."""
    found: list[Violation] = []
    used: set[tuple[str, str]] = set()
    for edge in imports(root):
        for rule in rule_violations(edge):
            if (edge.importer, edge.target) in exceptions:
                used.add((edge.importer, edge.target))
            else:
                found.append(Violation(rule, edge))
    return found, used


def imports_of_test_modules(root: Path) -> list[Import]:
    """Every import, by a module under `root/tests`, of a test module (one whose file name starts with
    `test_`)."""
    return [
        edge
        for edge in imports(root, tuple(TESTS.items()))
        if _within(edge.target, tuple(TESTS)) and edge.target.rpartition(".")[2].startswith("test_")
    ]


def cycles(root: Path) -> list[list[str]]:
    """The import cycles between modules of the tree (strongly connected components of more than one
    module; a package's implicit import of its `__init__` is not an edge)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for edge in imports(root):
        if edge.target in known and edge.target != edge.importer:
            graph[edge.importer].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's algorithm; the tree is a few hundred modules deep at most
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in graph[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def test_the_repository_keeps_the_import_rules() -> None:
    found, used = violations(ROOT, EXCEPTIONS)
    assert not found, "import rules broken (docs/architecture.md):\n" + "\n".join(map(str, found))
    assert used == set(EXCEPTIONS), f"exceptions no import needs any more, remove them: {set(EXCEPTIONS) - used}"


def test_the_repository_has_no_import_cycles() -> None:
    assert cycles(ROOT) == []


def test_no_test_module_imports_another_test_module() -> None:
    edges = imports_of_test_modules(ROOT)
    found = [
        f"{edge.where}: {edge.importer} imports {edge.target}"
        for edge in edges
        if (edge.importer, edge.target) not in TEST_IMPORT_EXCEPTIONS
    ]
    used = {(edge.importer, edge.target) for edge in edges} & set(TEST_IMPORT_EXCEPTIONS)
    assert not found, "tests import from test modules; move the shared helpers into a support module:\n" + "\n".join(
        found
    )
    assert used == set(TEST_IMPORT_EXCEPTIONS), (
        f"exceptions no import needs any more, remove them: {set(TEST_IMPORT_EXCEPTIONS) - used}"
    )


def test_every_owner_module_exists() -> None:
    known = modules(ROOT)
    missing = [name for owners in OWNERS.values() for name in owners if name not in known]
    missing += [name for pair in EXCEPTIONS for name in pair if name not in known]
    assert not missing


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_finds_one_violation_of_each_rule(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lodestar/__init__.py": "",
            "lodestar/etcd.py": "import aetcd\n",  # an owner: allowed
            "lodestar/util.py": "from lodestar_rollout import spec\n",
            "lodestar/web.py": "def serve():\n    from aiohttp import web\n",
            "lodestar_app/cli/__init__.py": "from lodestar_gateway import proxy\n",  # the CLI may use services
            "lodestar/v1/__init__.py": "import torch\n",  # generated: not checked
            "services/gateway/lodestar_gateway/__init__.py": "",
            "services/gateway/lodestar_gateway/proxy.py": "import torch\nfrom lodestar_rollout import spec\n",
            "services/rollout/lodestar_rollout/__init__.py": "",
            "services/rollout/lodestar_rollout/spec.py": (
                "import typing\nif typing.TYPE_CHECKING:\n    import lodestar_app.cli\n"
            ),
            "services/trainer/lodestar_trainer/__init__.py": "",
            "services/trainer/lodestar_trainer/loop.py": "import torch\nimport psycopg\n",
        },
    )
    found, _ = violations(root, {})
    assert sorted(str(violation) for violation in found) == [
        "lodestar/util.py:1: lodestar.util imports lodestar_rollout.spec: the kernel imports a service",
        "lodestar/web.py:2: lodestar.web imports aiohttp: aiohttp is imported only by its owners "
        "(lodestar_gateway.app, lodestar_gateway.server, lodestar_app.dashboard.server)",
        "services/gateway/lodestar_gateway/proxy.py:1: lodestar_gateway.proxy imports torch: torch only in "
        "lodestar_inference and lodestar_trainer",
        "services/gateway/lodestar_gateway/proxy.py:2: lodestar_gateway.proxy imports lodestar_rollout.spec: "
        "a service imports another service",
        "services/rollout/lodestar_rollout/spec.py:3: lodestar_rollout.spec imports lodestar_app.cli: "
        "only the application layer imports the application layer",
        "services/trainer/lodestar_trainer/loop.py:2: lodestar_trainer.loop imports psycopg: psycopg is imported "
        "only by its owners (lodestar_rollout.pgstore)",
    ]
    allowed, used = violations(root, {("lodestar.util", "lodestar_rollout.spec"): "a test"})
    assert len(allowed) == len(found) - 1
    assert used == {("lodestar.util", "lodestar_rollout.spec")}


def test_the_checker_finds_cycles_through_function_and_type_checking_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "services/rollout/lodestar_rollout/__init__.py": "",
            "services/rollout/lodestar_rollout/groups.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from lodestar_rollout.scheduler import Scheduler\n",
            "services/rollout/lodestar_rollout/scheduler.py": "from lodestar_rollout import groups\n",
            "services/rollout/lodestar_rollout/store.py": "def f():\n    from . import model\n",
            "services/rollout/lodestar_rollout/model.py": "from .store import f\n",
            "services/rollout/lodestar_rollout/alone.py": "from lodestar_rollout import model\n",
        },
    )
    assert sorted(cycles(root)) == [
        ["lodestar_rollout.groups", "lodestar_rollout.scheduler"],
        ["lodestar_rollout.model", "lodestar_rollout.store"],
    ]


def test_the_checker_finds_imports_of_test_modules(tmp_path: Path) -> None:
    absolute = "from tests.rollout." + "test_a import x\n"  # split: a grep of tests/ for such imports skips it
    root = _tree(
        tmp_path,
        {
            "tests/__init__.py": "",
            "tests/waiting.py": "",
            "tests/rollout/__init__.py": "",
            "tests/rollout/helpers.py": "from tests.waiting import eventually\n",  # a support module: allowed
            "tests/rollout/test_a.py": "from tests.rollout.helpers import x\n",
            "tests/rollout/test_b.py": absolute,
            "tests/rollout/test_c.py": "def f():\n    from . import test_a\n",
            "tests/rollout/test_d.py": "import tests.rollout.test_b\n",
            "tests/rollout/stack.py": "from .test_a import x\n",
        },
    )
    assert sorted(f"{edge.where}: {edge.importer} imports {edge.target}" for edge in imports_of_test_modules(root)) == [
        "tests/rollout/stack.py:1: tests.rollout.stack imports tests.rollout.test_a",
        "tests/rollout/test_b.py:1: tests.rollout.test_b imports tests.rollout.test_a",
        "tests/rollout/test_c.py:2: tests.rollout.test_c imports tests.rollout.test_a",
        "tests/rollout/test_d.py:1: tests.rollout.test_d imports tests.rollout.test_b",
    ]
