"""The README and docs/ name only what exists: every repository path they put in `code` (a file or folder of
git's, a test and its function) and every `make <target>`.

A path is checked when its first part is one of the repository's own (src/, tests/, docs/, studies/, flows/,
benchmarks/, reports/, a top-level file); the pipeline's outputs that DVC keeps out of git (data/, models/,
reports/ under a dvc.yaml output) and placeholders (`<model>`, `*`, `${...}`) are not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = {"src", "tests", "docs", "studies", "flows", "benchmarks", "reports", ".ci"}
TOP_FILES = {p.name for p in REPO.iterdir() if p.is_file()}
CODE = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^[\w.\-/]+(::[\w\[\]\-]+)?$")
MAKE = re.compile(r"\bmake[ \t]+(?:-s[ \t]+)?([a-z][\w-]*[a-z0-9])(?![\w*-])")
FENCED = re.compile(r"```.*?```", re.S)
PLACEHOLDER = re.compile(r"[<>*{}$]")


def dvc_outputs() -> list[str]:
    """The paths dvc.yaml's stages write (with ${item...} as a wildcard prefix): out of git, possibly absent."""
    outs = []
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        for key in ("outs", "metrics"):
            for out in stage.get(key, []):
                outs.append((out if isinstance(out, str) else next(iter(out))).split("${")[0])
    return outs


OUTPUTS = dvc_outputs()


def code_text(text: str) -> list[str]:
    """What a doc puts in `code`, inline or in fenced blocks."""
    return CODE.findall(FENCED.sub("", text)) + FENCED.findall(text)


def named_paths(text: str) -> set[str]:
    found = set()
    for code in code_text(text):
        for word in code.split():
            word = word.strip("(),;:'\"").removeprefix("./")
            if PLACEHOLDER.search(word) or not PATHLIKE.match(word):
                continue
            path = word.split("::")[0]
            first = path.split("/")[0]
            if (first in ROOTS and "/" in path) or (path in TOP_FILES | {"dvc.lock"}):
                found.add(word)
    return found


def exists(named: str) -> bool:
    path, _, test = named.partition("::")
    file = REPO / path.rstrip("/")
    if not file.exists():
        return any(path.startswith(out) for out in OUTPUTS if out)
    if test:  # a test function (or class) of that file
        names = {n.name for n in ast.walk(ast.parse(file.read_text())) if hasattr(n, "name")}
        return test.split("[")[0] in names
    return True


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_path_a_doc_names_exists(doc):
    missing = sorted(p for p in named_paths(doc.read_text()) if not exists(p))
    assert not missing, f"{doc.relative_to(REPO)} names {missing}, which do not exist"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_make_target_a_doc_names_exists(doc):
    text = "\n".join(code_text(doc.read_text()))
    missing = sorted(set(MAKE.findall(text)) - make_targets())
    assert not missing, f"{doc.relative_to(REPO)} names `make {missing}`, which the Makefile does not have"


def test_the_check_sees_a_missing_path_and_target():
    assert named_paths("see `tests/flows/test_stack.py` and `src/contextual_bert/cli.py`") == {
        "tests/flows/test_stack.py",
        "src/contextual_bert/cli.py",
    }
    assert not exists("tests/flows/test_stack.py") and exists("src/contextual_bert/cli.py")
    assert exists("tests/test_cli.py::test_every_dvc_stage_command_is_a_cli_subcommand")
    assert not exists("tests/test_cli.py::test_nothing_of_that_name")
    assert exists("reports/eval/none-s0.json") and exists("models/none-s0")  # DVC's outputs
    assert "repro" in make_targets() and "deploy" not in make_targets()
