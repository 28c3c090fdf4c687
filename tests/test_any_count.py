"""`Any` in kotoba_vllm, counted over the syntax tree by scripts/count-any.py (aliases of Any, string
annotations and `typing.Any` included), stays at or below its ceiling: a new `Any` needs a type instead,
or a lower count elsewhere. Issue 34 asks for fewer than 250; the ceiling comes down as types replace it."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CEILING = 118  # the count when the ceiling was last lowered (2026-12-02); lower it with each cut, never raise it


def _counter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("count_any", ROOT / "scripts" / "count-any.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_any_stays_under_its_ceiling() -> None:
    by_file = _counter().count(ROOT / "kotoba_vllm")
    total = sum(by_file.values())
    worst = sorted(by_file.items(), key=lambda kv: -kv[1])[:5]
    assert total <= CEILING, f"{total} Any (ceiling {CEILING}); most in: {worst}"


def test_the_counter_sees_aliases_strings_and_the_module_spelling(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from typing import Any, Any as A\nimport typing\nJSON = Any\n"
        "def f(x: Any, y: 'dict[str, Any]', z: A) -> typing.Any: ...\nv: list[JSON] = []\n", encoding="utf-8")
    (pkg / "clean.py").write_text("def g(x: int) -> str: ...\nAny = 3\n", encoding="utf-8")
    assert _counter().count(pkg) == {"pkg/clean.py": 0, "pkg/m.py": 6}
