"""The package's layout: its import graph (module-level and function-local imports) has no cycle."""

import import_graph


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
