"""The DVC pipeline as users run it: which stages a params change makes stale (dvc status on dvc.lock)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).parent / "dvc"


def _params_changes(workdir: Path) -> dict[str, set[str]]:
    """Stage -> the params keys `dvc status` reports as changed for it."""
    out = subprocess.run([str(DVC), "status", "--json"], cwd=workdir, capture_output=True, text=True, check=True)
    changes = {}
    for stage, entries in json.loads(out.stdout).items():
        for entry in entries:
            if isinstance(entry, dict) and "changed deps" in entry:
                keys = entry["changed deps"].get("params.yaml", {})
                if keys:
                    changes[stage] = set(keys)
    return changes


@pytest.fixture
def pipeline_copy(tmp_path):
    if not (REPO / "dvc.lock").exists():
        pytest.skip("no dvc.lock committed yet")
    for name in ("dvc.yaml", "params.yaml", "dvc.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    assert _params_changes(tmp_path) == {}, "dvc.lock was written with other params than params.yaml"
    return tmp_path


def _set(workdir: Path, dotted: str, value) -> None:
    path = workdir / "params.yaml"
    params = yaml.safe_load(path.read_text())
    *parents, key = dotted.split(".")
    node = params
    for part in parents:
        node = node[part] if node.get(part) is not None else node.setdefault(part, {})
    node[key] = value
    path.write_text(yaml.safe_dump(params))


def test_one_models_param_makes_only_that_models_trainings_stale(pipeline_copy):
    params = yaml.safe_load((pipeline_copy / "params.yaml").read_text())
    current = (params["per_model"]["global_state"] or {}).get("learning_rate", params["train"]["learning_rate"])
    _set(pipeline_copy, "per_model.global_state.learning_rate", current * 2)  # a value it does not have
    seeds = params["train"]["seeds"]
    assert set(_params_changes(pipeline_copy)) == {f"train@global_state-{s}" for s in seeds}


def test_adding_a_seed_does_not_retrain_the_others(pipeline_copy):
    params = yaml.safe_load((pipeline_copy / "params.yaml").read_text())
    params["train"]["seeds"] = params["train"]["seeds"] + [7]
    (pipeline_copy / "params.yaml").write_text(yaml.safe_dump(params))
    stale = {stage for stage in _params_changes(pipeline_copy) if stage.startswith("train@")}
    assert stale == {f"train@{v}-7" for v in params["train"]["models"]}  # the new seed's only


def test_a_shared_train_setting_makes_every_training_stale(pipeline_copy):
    _set(pipeline_copy, "train.learning_rate", 0.01)
    params = yaml.safe_load((pipeline_copy / "params.yaml").read_text())
    expected = {f"train@{v}-{s}" for v in params["train"]["models"] for s in params["train"]["seeds"]}
    assert {s for s in _params_changes(pipeline_copy) if s.startswith("train@")} == expected
