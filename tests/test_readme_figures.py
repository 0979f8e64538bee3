"""The benchmark table (docs/results.md) quotes only what a current file holds: every number in a row's result is
a value of one of the files the row names (in its unit: as recorded, seconds as minutes, a share as a percentage), rounded as
the table shows it. A figure whose file was re-measured without it, or that no file ever held, fails here."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "reports" / "benchmarks"
NUMBER = re.compile(r"(?<![\w.@-])\d[\d,]*(?:\.\d+)?(?![\w]|\.\d)")
SCALES = (1, 1 / 60, 100, 2**-10, 2**-30)  # as recorded; seconds in minutes; a share in %; MiB or bytes in GiB


def benchmark_rows(readme: str) -> list[tuple[str, str, list[str]]]:
    section = readme.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("what", "---"):
            rows.append((cells[0], cells[1], re.findall(r"`([^`]+\.json)`", cells[2])))
    return rows


def recorded(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [number for item in items for number in recorded(item)]


def held(shown: str, values: list[float]) -> bool:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    target = float(shown.replace(",", ""))
    half = 0.5 * 10.0**-decimals + 1e-9  # the table rounds half up, Python's round() to even
    return any(abs(v * scale - target) <= half for v in values for scale in SCALES)


ROWS = benchmark_rows((REPO / "docs" / "results.md").read_text())


def test_the_benchmark_table_is_read():
    assert len(ROWS) >= 4 and all(files for _, _, files in ROWS)


@pytest.mark.parametrize("what, result, files", ROWS, ids=[r[0][:40] for r in ROWS])
def test_every_figure_is_held_by_a_current_file(what, result, files):
    values = [v for name in files for v in recorded(json.loads((BENCHMARKS / name).read_text()))]
    missing = [shown for shown in NUMBER.findall(result) if not held(shown, values)]
    assert not missing, f"the benchmark row {what!r} quotes {missing}, which none of {files} holds"


def test_the_first_run_figure_names_its_commit_and_cpu():
    record = json.loads((BENCHMARKS / "repro.json").read_text())
    assert len(record["commit"]) == 40 and record["cpu"]["model"]


def test_a_figure_no_file_holds_fails():
    assert not held("14.9", [886.7]) and held("14.8", [886.7]) and held("4,440", [4440.2])
