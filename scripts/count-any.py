#!/usr/bin/env python3
"""Count `typing.Any` in kotoba_vllm's code, over the syntax tree: every reference to Any (also as
`typing.Any`, a name imported `as` another, or a module-level alias such as `JSON = Any`), in
annotations (string annotations parsed too), aliases, casts and generic arguments alike; the import
itself is not counted. `python scripts/count-any.py [--by-file] [PACKAGE_DIR]`; tests/test_any_count.py
holds the total to its ceiling."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _any_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names that mean Any in this module, and names bound to the typing module."""
    names, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "typing_extensions"):
            names.update(a.asname or a.name for a in node.names if a.name == "Any")
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name in ("typing", "typing_extensions"))
    changed = True
    while changed:  # module-level aliases: `X = Any`, `X: TypeAlias = Any`, and aliases of those
        changed = False
        for node in tree.body:
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                target, value = node.target.id, node.value
            if target and target not in names and _is_any(value, names, modules):
                names.add(target)
                changed = True
    return names, modules


def _is_any(node: ast.AST | None, names: set[str], modules: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return (isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name)
            and node.value.id in modules)


def _annotations(tree: ast.Module) -> list[ast.expr]:
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            out += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                    if a is not None and a.annotation is not None]
            if node.returns is not None:
                out.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            out.append(node.annotation)
    return out


def count_file(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names, modules = _any_names(tree)
    if not names and not modules:
        return 0
    # every reference, an alias's definition (`JSON = Any`) and each of its uses included
    n = sum(1 for node in ast.walk(tree)
            if _is_any(node, names, modules) and not isinstance(getattr(node, "ctx", None), ast.Store))
    for ann in _annotations(tree):  # string annotations ("dict[str, Any]") are text in the tree
        for node in ast.walk(ann):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    inner = ast.parse(node.value, mode="eval")
                except SyntaxError:
                    continue
                n += sum(1 for x in ast.walk(inner) if _is_any(x, names, modules))
    return n


def count(package: Path) -> dict[str, int]:
    return {str(p.relative_to(package.parent)): count_file(p) for p in sorted(package.rglob("*.py"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("package", nargs="?", default=str(ROOT / "kotoba_vllm"))
    ap.add_argument("--by-file", action="store_true")
    a = ap.parse_args(argv)
    by = count(Path(a.package))
    if a.by_file:
        for name, n in sorted(by.items(), key=lambda kv: -kv[1]):
            if n:
                print(f"{n:5d}  {name}")
    print(sum(by.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
