"""scripts/size_check.py, the size limits of `make sizes`: checked on a synthetic tree (so it can fail) and
on the repository itself."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("size_check", REPO / "scripts" / "size_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def test_checker_names_each_offender_and_nothing_else(tmp_path: Path) -> None:
    checker = load_checker()
    (tmp_path / "lodestar" / "v1").mkdir(parents=True)
    (tmp_path / "services" / "gateway" / "lodestar_gateway").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    (tmp_path / "elsewhere").mkdir()
    # Exactly at the limits: fine.
    (tmp_path / "lodestar" / "ok.py").write_text(function("fits", 79) + "x = 1\n" * (600 - 80))
    # A long function, and a class method nested in it.
    (tmp_path / "services" / "gateway" / "lodestar_gateway" / "long.py").write_text(
        "\n" + function("too_long", 81) + "class C:\n" + function("method", 90, indent="    ")
    )
    (tmp_path / "bench" / "big.py").write_text("x = 1\n" * 601)
    # Generated code and code outside our directories are not measured.
    (tmp_path / "lodestar" / "v1" / "gen_pb2.py").write_text("x = 1\n" * 5000)
    (tmp_path / "elsewhere" / "big.py").write_text("x = 1\n" * 5000)

    found = [str(o) for o in checker.offenders(tmp_path)]

    assert found == [
        "bench/big.py:1 (file) (601 lines)",
        "services/gateway/lodestar_gateway/long.py:2 too_long (82 lines)",
        "services/gateway/lodestar_gateway/long.py:85 method (91 lines)",
    ]
    assert checker.main([str(tmp_path)]) == 1
    (tmp_path / "bench" / "big.py").unlink()
    (tmp_path / "services" / "gateway" / "lodestar_gateway" / "long.py").unlink()
    assert checker.main([str(tmp_path)]) == 0
