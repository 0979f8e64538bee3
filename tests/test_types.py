"""The type check: mypy over the packages pyproject.toml's [tool.mypy] names (model/, training/, config.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_mypy_passes_on_the_checked_packages():
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
