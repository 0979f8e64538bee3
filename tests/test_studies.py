"""The studies' layout: a folder per study with its scripts, one results file and one findings page."""

import json
import sys
from pathlib import Path

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
