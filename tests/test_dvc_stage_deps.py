"""dvc.yaml knows what each stage runs: every `contextual_bert` module that a stage's command imports,
directly or through other modules, at module level or inside a function, is among the stage's deps. The
trainings and their evaluations (hours) list no other module: a dep is a module they run or a package all of
whose modules they run, so editing any other code retrains nothing. The stages that take seconds depend on
the whole package (COARSE).

Static: the command's CLI handler (and the cli.py functions it calls) are read with ast, then the import
graph of the package (tests/import_graph.py). A dep missing here means `dvc repro` reports a stage up to
date after a change to code it runs.
"""

import ast
import re
import shlex
from pathlib import Path

import import_graph
import pytest
import yaml

from contextual_bert.cli import build_parser
from contextual_bert.config import MODELS

REPO = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
# Values for a matrix stage's ${item.*}: the command's code does not depend on them.
ITEM = {"${item.model}": MODELS[0], "${item.seed}": "0"}
LOGGED_CODE = re.compile(r'PACKAGE_DIR((?: / "\w+")*) / "(\w+)\.py"')


def command_args(cmd: str) -> list[str]:
    for placeholder, value in ITEM.items():
        cmd = cmd.replace(placeholder, value)
    program, *args = shlex.split(cmd)
    assert program == "contextual-bert", f"not a contextual-bert command: {cmd}"
    return args


def cli_functions(name: str) -> list[ast.FunctionDef]:
    """The cli.py function `name` and every cli.py function it refers to, transitively."""
    functions = {n.name: n for n in import_graph.tree("cli").body if isinstance(n, ast.FunctionDef)}
    seen, todo = {}, [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen[current] = functions[current]
        todo += [n.id for n in ast.walk(functions[current]) if isinstance(n, ast.Name) and n.id in functions]
    return list(seen.values())


def source_modules(functions: list[ast.FunctionDef]) -> set[str]:
    """Sources run by name through the one table (sources.SOURCES, importlib): `SOURCES["hm"]` in a handler
    runs that entry's module, `ingest(cfg)` any of them."""
    from contextual_bert.data.sources import SOURCES

    found = set()
    for function in functions:
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "SOURCES"
                and isinstance(node.slice, ast.Constant)
            ):
                found.add(SOURCES[node.slice.value].module)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("ingest", "write_fingerprint")
            ):  # each runs the chosen source's module: any of them
                found |= {source.module for source in SOURCES.values()}
    return set().union(*(import_graph.with_packages(m.removeprefix(import_graph.PACKAGE + ".")) for m in found))


def modules_run_by(cmd: str) -> set[str]:
    """The package modules a `contextual-bert ...` command runs: cli.py, its module-level imports, the
    imports of its handler, and everything those import."""
    handler = build_parser().parse_args(command_args(cmd)).handler.__name__
    cli = import_graph.tree("cli")
    module_level = set()
    for node in cli.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module_level |= import_graph.imported_modules(node)
    functions = cli_functions(handler)
    in_handler = set().union(*(import_graph.imported_modules(f) for f in functions)) | source_modules(functions)
    # cli itself, not through direct_imports("cli"): that holds every handler's imports
    run = {"cli"} | import_graph.closure(module_level | in_handler)
    # a module's file that a run module logs as code (serving.completer.PYFUNC_CODE:
    # `PACKAGE_DIR / "serving" / "pyfunc_model.py"`)
    logged = {
        ".".join([*(part.strip(' /"') for part in folders.split(" / ") if part.strip(' /"')), name])
        for r in sorted(run)
        for folders, name in LOGGED_CODE.findall(import_graph.module_path(r).read_text())
    }
    return run | logged


# Stages that depend on the whole package, and why that costs little: any code change reruns them.
PACKAGE_DIR = "src/contextual_bert"
COARSE = {
    name: "seconds to run (reports/benchmarks/repro*.json), and what follows reruns only when its output changes"
    for name in ("source", "ingest", "validate", "features", "baseline", "optimum", "report", "register", "promote")
}


def code_path(module: str) -> str:
    """A module's file as dvc.yaml names it."""
    return import_graph.module_path(module).relative_to(REPO).as_posix()


def covered(path: str, deps: list[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def dep_paths(stage: dict) -> list[str]:
    return [d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])]


def code_files(dep: str) -> set[str]:
    """The package's files a code dep stands for: the file, or every module under the folder."""
    path = REPO / dep
    if path.is_dir():
        return {p.relative_to(REPO).as_posix() for p in path.rglob("*.py") if "__pycache__" not in p.parts}
    return {dep}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_list_every_module_its_command_runs(name):
    stage = STAGES[name]
    deps = dep_paths(stage)
    needed = {code_path(m) for m in modules_run_by(stage["cmd"])}
    missing = sorted(p for p in needed if not covered(p, deps))
    assert not missing, f"dvc.yaml stage '{name}' runs {missing} but does not list them in deps"


@pytest.mark.parametrize("name", sorted(set(STAGES) - set(COARSE)))
def test_a_precise_stage_lists_no_code_it_does_not_run(name):
    # a module listed but not run makes DVC re-run the stage (hours of training) for a change it cannot see
    deps = dep_paths(STAGES[name])
    needed = {code_path(m) for m in modules_run_by(STAGES[name]["cmd"])}
    surplus = sorted(d for d in deps if d.startswith("src/") and not code_files(d) <= needed)
    assert not surplus, (
        f"dvc.yaml stage '{name}' lists {surplus} in deps but its command does not run (all of) them: "
        "name single modules of a package it does not run whole"
    )


@pytest.mark.parametrize("name", sorted(COARSE))
def test_a_coarse_stage_depends_on_the_whole_package(name):
    assert [d for d in dep_paths(STAGES[name]) if d.startswith("src/")] == [PACKAGE_DIR]


def test_a_serving_or_ingest_change_retrains_nothing():
    for name in ("train", "evaluate"):
        deps = dep_paths(STAGES[name])
        for module in ("serving/completer.py", "data/sources/hm.py", "registry/promotion.py", "evaluation/report.py"):
            assert not covered(f"{PACKAGE_DIR}/{module}", deps), (name, module)


def test_the_check_fails_on_a_missing_or_a_surplus_dep(monkeypatch):
    train = STAGES["train"]
    without = [d for d in train["deps"] if d != f"{PACKAGE_DIR}/registry/tracking.py"]
    monkeypatch.setitem(STAGES, "train", dict(train, deps=without))
    with pytest.raises(AssertionError, match="registry/tracking.py"):
        test_stage_deps_list_every_module_its_command_runs("train")
    monkeypatch.setitem(STAGES, "train", dict(train, deps=[*train["deps"], f"{PACKAGE_DIR}/registry"]))
    with pytest.raises(AssertionError, match="registry"):
        test_a_precise_stage_lists_no_code_it_does_not_run("train")


def test_dvc_ignores_bytecode():
    # a folder dep hashes every file DVC sees in it: __pycache__'s .pyc files differ per machine and Python
    assert "__pycache__/" in (REPO / ".dvcignore").read_text().split()


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_code_deps_exist(name):
    code = [d for d in dep_paths(STAGES[name]) if d.startswith("src/")]
    assert code and all((REPO / d).exists() for d in code), code


def test_the_derivation_follows_handlers_and_function_local_imports():
    # evaluate's handler imports evaluation and tracking inside the function; evaluation imports
    # feature_store inside functions and model at module level.
    run = modules_run_by("contextual-bert evaluate --model ${item.model} --seed ${item.seed}")
    assert {
        "cli",
        "config",
        "errors",
        "evaluation.evaluate",
        "registry.tracking",
        "data.feature_store",
        "model",
        "model.encoder",
        "devices",
    } <= run
    assert "registry.models" not in run and "data.sources.synthetic" not in run
    # ingest dispatches to the generate and import-hm handlers: both are run by it.
    assert {"data.sources.synthetic", "data.sources.hm", "data.contract"} <= modules_run_by("contextual-bert ingest")
