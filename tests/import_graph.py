"""The static import graph of src/contextual_bert, read with ast (module-level and function-local imports; not
those under `if TYPE_CHECKING:`, which only a type checker runs).

A module is named by its dotted path inside the package ("cli", "model.encoder"); a package by its own name
("model"), standing for its __init__.py, which every import of one of its modules runs too. The package's root
__init__.py (a docstring and the version) is left out. Shared by the tests on the package's layout (no cycles)
and on dvc.yaml's stage deps.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "contextual_bert"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE


def module_path(module: str) -> Path:
    """The file of a module or package, named with or without the package's prefix."""
    relative = SRC / module.removeprefix(PACKAGE + ".").replace(".", "/")
    return relative / "__init__.py" if relative.is_dir() else relative.with_suffix(".py")


def with_packages(module: str) -> set[str]:
    """`module` and the packages an import of it runs: "model.encoder" -> {"model", "model.encoder"}."""
    parts = module.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): its body runs under a type checker, never at run time."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_nodes(node: ast.AST) -> list[ast.AST]:
    """`node` and every node inside it, as ast.walk, less the bodies of `if TYPE_CHECKING:` (their `else:` runs)."""
    found, todo = [], [node]
    while todo:
        current = todo.pop()
        found.append(current)
        if isinstance(current, ast.If) and type_checking_only(current):
            todo.extend(current.orelse)
        else:
            todo.extend(ast.iter_child_nodes(current))
    return found


def imported_modules(node: ast.AST) -> set[str]:
    """The package's modules imported anywhere inside `node` where it runs (not under `if TYPE_CHECKING:`), with
    their packages (relative imports are not used here)."""
    found = set()
    for child in run_nodes(node):
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module:
            # `from contextual_bert.data import features` imports the module data.features
            names = [child.module] + [f"{child.module}.{alias.name}" for alias in child.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + ".") and module_path(name).exists():
                found |= with_packages(name.removeprefix(PACKAGE + "."))
    return found


@cache
def tree(module: str) -> ast.Module:
    return ast.parse(module_path(module).read_text(), filename=str(module_path(module)))


@cache
def direct_imports(module: str) -> frozenset[str]:
    return frozenset(imported_modules(tree(module)) - {module})


def modules() -> list[str]:
    names = []
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts == ("__init__",):
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


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
    """One import cycle as a list of modules (first == last), or None. A package's __init__ importing its own
    modules is no cycle (they run it first, and it them): edges from a module to its own packages are left out."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(direct_imports(module) - with_packages(module)):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in modules():
        if module not in state and (cycle := visit(module)):
            return cycle
    return None
