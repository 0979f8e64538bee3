"""The studies' layout: a folder per study with its scripts, one results file and one findings page; and the
package's API they and the benchmarks use: its public names only."""

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

STUDY_FILES = {"findings.md", "results.json", "settings.yaml"}  # besides its scripts


def test_a_study_keeps_its_scripts_one_results_file_and_one_findings_page():
    studies = sorted(p for p in (REPO / "studies").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert len(studies) > 10  # the scan sees the studies
    stray = [str(f.relative_to(REPO)) for study in studies for f in study.rglob("*")
             if f.is_file() and "__pycache__" not in f.parts
             and not (f.parent == study and (f.suffix == ".py" or f.name in STUDY_FILES))]  # fmt: skip
    assert stray == []
    assert [s.name for s in studies if not (s / "findings.md").exists()] == []
    for results in (REPO / "studies").glob("*/results.json"):
        assert json.loads(results.read_text())  # one JSON object, an entry per run


def test_record_adds_a_run_and_keeps_the_others(tmp_path):
    results = tmp_path / "results.json"
    record(results, "b/metrics", {"cross_entropy": 3.9})
    record(results, "a/metrics", {"cross_entropy": 4.1})
    record(results, "b/metrics", {"cross_entropy": 3.8})  # a run recorded again replaces its entry
    entries = json.loads(results.read_text())
    assert entries == {"a/metrics": {"cross_entropy": 4.1}, "b/metrics": {"cross_entropy": 3.8}}
    assert list(entries) == ["a/metrics", "b/metrics"]


PACKAGE = "contextual_bert"


def package_imports(source: str) -> list[tuple[str, str | None, int]]:
    """(module, name, line) for every use of the package in a script's `source`, at any depth (inside functions
    too): `from m import a` as (m, a), `import m` as (m, None), and `b.a` where `from contextual_bert import b` (or
    `import contextual_bert.b as b`) bound b to a public module or subpackage as (contextual_bert.b, a)."""
    tree = ast.parse(source)
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
            if node.module == PACKAGE:
                bound |= {alias.asname or alias.name: f"{PACKAGE}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.append((alias.name, None, node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            found.append((bound[node.value.id], node.attr, node.lineno))
    return found


def not_public(module: str, name: str | None) -> str | None:
    """Why `from module import name` (name None: `import module`) reaches past the package's public API, or None
    where it does not. Public: `contextual_bert.__all__` (the top-level modules, whose names are public but for a
    leading underscore, and the subpackages) and each subpackage's `__all__`; never a module inside a subpackage."""
    root = importlib.import_module(PACKAGE)
    parts = module.split(".")
    if len(parts) > 2:
        return f"{module} is a module inside a subpackage: import from {'.'.join(parts[:2])}"
    if len(parts) == 2 and parts[1] not in getattr(root, "__all__", ()):
        return f"{module} is not public ({PACKAGE}.__all__)"
    if name is None:
        return None
    imported = importlib.import_module(module)
    exported = getattr(imported, "__all__", None)
    if exported is None and name.startswith("_"):
        return f"{module}.{name} is private"
    if exported is not None and name not in exported:
        return f"{name} is not in {module}.__all__"
    if not hasattr(imported, name):
        try:
            importlib.import_module(f"{module}.{name}")  # `from contextual_bert import training`: the subpackage
        except ImportError:
            return f"{module}.{name} does not resolve"
    return None


# A script that times the Trainer's calls in place: it replaces the names the Trainer's modules call, so those
# modules are what it measures and no public name reaches them. Only these uses are let past.
IN_PLACE_PROFILERS = {
    "benchmarks/profile_run.py": {
        ("contextual_bert.training", name) for name in ("checkpoints", "loop", "trainer", "unseen_fit", "warmup_hook")
    }
}


@pytest.mark.parametrize("folder, at_least", [("studies", 100), ("benchmarks", 100)])
def test_the_studies_and_benchmarks_use_the_package_s_public_api_only(folder, at_least):
    # studies/ and benchmarks/ are the package's first users: they import its public names (docs/architecture.md),
    # so that a module inside a subpackage can be renamed, split or merged without breaking a script no test runs.
    scripts = sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
    uses = [(script.relative_to(REPO).as_posix(), *use) for script in scripts
            for use in package_imports(script.read_text())]  # fmt: skip
    assert len(uses) > at_least  # the scan sees the scripts' imports, module level and function-local
    checked = [use for use in uses if use[1:3] not in IN_PLACE_PROFILERS.get(use[0], ())]
    past = [f"{script}:{line}: {why}" for script, module, name, line in checked
            if (why := not_public(module, name))]  # fmt: skip
    assert past == []


@pytest.mark.parametrize(
    "source, why",
    [
        ("from contextual_bert.evaluation.bootstrap import paired_difference", "inside a subpackage"),
        ("def f():\n    from contextual_bert.data.feature_store import load_split", "inside a subpackage"),
        ("import contextual_bert.training.loop", "inside a subpackage"),
        ("from contextual_bert.training import loop", "not in contextual_bert.training.__all__"),
        ("from contextual_bert import training\ntraining.loop.masked_item_loss = None", "not in"),
        ("from contextual_bert.lazy import lazy_exports", "not public"),
        ("from contextual_bert.config import _private", "private"),
        ("from contextual_bert.config import no_such_name", "does not resolve"),
    ],
)
def test_the_public_api_check_finds_a_reach_past_it(source, why):
    reasons = [not_public(module, name) for module, name, _ in package_imports(source)]
    assert any(why in (reason or "") for reason in reasons), reasons


def test_the_public_api_check_passes_the_public_names():
    source = (
        "from contextual_bert.evaluation import OUTFITS_KEY, paired_difference\n"
        "from contextual_bert import cpu_kernels, training\nfrom contextual_bert.config import load_config\n"
        "training.step_loss\nimport contextual_bert.model\nfrom contextual_bert.devices import select_device\n"
    )
    assert [not_public(module, name) for module, name, _ in package_imports(source)] == [None] * 8
