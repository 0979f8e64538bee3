"""The package's layout: its import graph (module-level and function-local imports) has no cycle; its subpackages'
public names (`__all__`, exported lazily where they are not imported with the package)."""

import import_graph
import pytest


def test_the_import_graph_of_the_package_has_no_cycle():
    assert import_graph.find_cycle() is None


def test_the_cycle_finder_finds_a_function_local_cycle(monkeypatch):
    # The check above must be able to fail: a graph with a cycle three modules long.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    monkeypatch.setattr(import_graph, "modules", lambda: sorted(graph))
    monkeypatch.setattr(import_graph, "direct_imports", lambda m: frozenset(graph[m]))
    assert import_graph.find_cycle() == ["a", "b", "c", "a"]


def test_function_local_imports_count(tmp_path):
    import ast

    source = "def f():\n    from contextual_bert.training import fit\n    import contextual_bert.model as m\n"
    assert import_graph.imported_modules(ast.parse(source)) == {"training", "model"}


def test_imports_under_type_checking_do_not_count():
    # A package's __init__ names its lazily exported names for mypy under `if TYPE_CHECKING:`; they never run, so
    # they are no edge of the graph (nor a dvc.yaml dep). Their `else:` runs.
    import ast

    source = (
        "import typing\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from contextual_bert.training import fit\nelse:\n    import contextual_bert.model\n"
        "def f():\n    if typing.TYPE_CHECKING:\n        from contextual_bert.data import feature_store\n"
        "    from contextual_bert.evaluation import evaluate\n"
    )
    assert import_graph.imported_modules(ast.parse(source)) == {"model", "evaluation", "evaluation.evaluate"}


def benchmark_imports() -> list[tuple[str, str, str]]:
    """(script, module, name) for every `from contextual_bert.<module> import <name>` in benchmarks/*.py and
    studies/**/*.py."""
    import ast

    found = []
    repo = import_graph.SRC.parents[1]
    for script in sorted([*(repo / "benchmarks").glob("*.py"), *(repo / "studies").rglob("*.py")]):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(import_graph.PACKAGE + "."):
                found += [(f"{script.parent.name}/{script.name}", node.module, alias.name) for alias in node.names]
    return found


def test_the_benchmarks_and_studies_import_only_names_the_package_has():
    # No test runs the benchmarks, so a renamed function would otherwise break one silently (it did once).
    import importlib

    imports = benchmark_imports()
    assert len(imports) > 20  # the scan sees the scripts' imports
    missing = [f"{script}: {module}.{name}" for script, module, name in imports
               if not hasattr(importlib.import_module(module), name)]  # fmt: skip
    assert missing == []


SUBPACKAGES = ("data", "evaluation", "model", "registry", "serving", "training")


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_a_subpackage_s_public_names_resolve_and_mypy_sees_the_lazy_ones(name):
    # __all__ is the public API (tests/test_studies.py holds studies/ to it); a lazily exported name is in
    # `_PUBLIC` (what runs) and under `if TYPE_CHECKING:` (what mypy reads), the same module for both
    import ast
    import importlib

    package = importlib.import_module(f"{import_graph.PACKAGE}.{name}")
    assert len(package.__all__) == len(set(package.__all__))
    assert [n for n in package.__all__ if not hasattr(package, n)] == []
    checked = {}
    for node in ast.walk(import_graph.tree(name)):
        if isinstance(node, ast.If) and import_graph.type_checking_only(node):
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom):
                    module = child.module.removeprefix(f"{import_graph.PACKAGE}.{name}.")
                    checked |= {alias.name: module for alias in child.names}
    assert checked == getattr(package, "_PUBLIC", {})
    assert set(checked) <= set(package.__all__)


def test_importing_a_subpackage_runs_none_of_its_lazily_exported_modules():
    import subprocess
    import sys

    code = (
        "import sys\nimport contextual_bert.data, contextual_bert.evaluation, contextual_bert.registry, "
        "contextual_bert.serving\nprint(sorted(m for m in sys.modules if m.startswith('contextual_bert')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == str(
        ["contextual_bert", "contextual_bert.analytics", "contextual_bert.data", "contextual_bert.evaluation",
         "contextual_bert.lazy", "contextual_bert.registry", "contextual_bert.serving"]
    ).split()  # fmt: skip
