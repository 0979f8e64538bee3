"""The type check: mypy over every module of src/ and flows/ (pyproject.toml's [tool.mypy]), none of them ignored."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_mypy_checks_all_of_src_and_flows_and_ignores_no_module():
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["src", "flows"]
    assert not any(override.get("ignore_errors") for override in mypy.get("overrides", []))
    assert not mypy.get("ignore_errors")


def test_mypy_passes_on_the_checked_packages():
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
