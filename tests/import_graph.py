"""The static import graph of src/contextual_bert, read with ast (module-level and function-local imports).

Shared by the tests on the package's layout (no cycles) and on dvc.yaml's stage deps.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "contextual_bert"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE


def module_path(module: str) -> Path:
    return SRC / f"{module.removeprefix(PACKAGE + '.').replace('.', '/')}.py"


def imported_modules(node: ast.AST) -> set[str]:
    """`contextual_bert.<name>` modules imported anywhere inside `node` (relative imports are not used here)."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module:
            # `from contextual_bert import features` imports the module features
            names = [child.module] + [f"{child.module}.{alias.name}" for alias in child.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + ".") and module_path(name).exists():
                found.add(name.split(".")[1])
    return found


@cache
def tree(module: str) -> ast.Module:
    return ast.parse(module_path(module).read_text(), filename=str(module_path(module)))


@cache
def direct_imports(module: str) -> frozenset[str]:
    return frozenset(imported_modules(tree(module)) - {module})


def modules() -> list[str]:
    return sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__")


def closure(start: set[str]) -> set[str]:
    """`start` and every module it imports, transitively."""
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(direct_imports(module))
    return seen


def find_cycle() -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(direct_imports(module)):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in modules():
        if module not in state and (cycle := visit(module)):
            return cycle
    return None
