"""dvc.yaml knows what each stage reads from params.yaml: a setting that changes a stage's result is among its
params, so editing it re-runs the stage (the params side of test_dvc_stage_deps.py, derived the same way).

The trainings are checked setting by setting against the config classes they read (TrainConfig, ModelConfig
and the per-model overrides); every other stage by the params.yaml sections its code reads (`cfg.<section>`
in the modules it runs, its own CLI handler only of cli.py).
"""

import ast

import import_graph
import pytest
import yaml
from test_dvc_stage_deps import REPO, STAGES, cli_functions, command_args, modules_run_by

from contextual_bert.cli import build_parser
from contextual_bert.config import ATTRIBUTE_SETTINGS, Config, ModelConfig, ModelOverrides, TrainConfig

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
PER_MODEL = "per_model.${item.model}"
# Train settings that are no params of a training, and why: they never change its result.
NOT_RESULTS = {
    "models": "shapes the matrix: which trainings exist, not what one computes",
    "seeds": "shapes the matrix (each training's seed is its own ${item.seed})",
    "checkpoint_every_s": "how often last.pt is written within an epoch; exact resume makes the result the same",
}
# Sections that say where results go or come from, not what they are.
NOT_RESULT_SECTIONS = {
    "paths": "where files are: DVC tracks them as deps and outs",
    "mlflow": "where runs are logged (a result's record, not the result), except for register and promote",
}
SECTIONS = set(Config.model_fields) | {"validate"}
# A section that a module a stage runs reads, in a function the stage never calls (the check reads whole modules).
ELSEWHERE = {
    ("evaluate", "features"): "registry.tracking logs the features section with a training's MLflow run",
    ("register", "features"): "registry.tracking logs the features section with a training's MLflow run",
    ("optimum", "ingest"): "data.sources.planted's ingest reads it; optimum reads what ingest wrote (data/raw, a dep)",
    ("optimum", "planted"): "data.sources.planted's ingest reads it; optimum reads what ingest wrote (data/raw, a dep)",
    ("source", "generate"): "the generators' ingest reads it; a generated source has no file to fingerprint",
    ("source", "planted"): "the generators' ingest reads it; a generated source has no file to fingerprint",
}


def stage_params(name: str) -> list[str]:
    """A stage's params keys, written one by one or as a `params.yaml: [keys]` group."""
    keys = []
    for p in STAGES[name].get("params", []):
        keys += [p] if isinstance(p, str) else [k for group in p.values() for k in group]
    return keys


def covers(params: list[str], key: str) -> bool:
    """Is params.yaml's `key` ("train.batch_size", "evaluate") among `params`, whole or through its section?"""
    return any(key == p or key.startswith(p + ".") or p.startswith(key + ".") for p in params)


def training_settings() -> dict[str, str]:
    """Every setting a training reads -> the params key that must list it."""
    keys = {f"train.{f}": f"train.{f}" for f in TrainConfig.model_fields if f not in NOT_RESULTS}
    keys |= {f"model.{f}": f"model.{f}" for f in ModelConfig.model_fields}
    for name in ATTRIBUTE_SETTINGS:  # set per model only (config.Config refuses them in train and model)
        keys.pop(f"train.{name}", None)
        keys.pop(f"model.{name}", None)
    keys |= {f"per_model.<model>.{f}": PER_MODEL for f in ModelOverrides.model_fields}
    return keys


def test_a_training_lists_every_setting_that_changes_its_result():
    params = stage_params("train")
    missing = sorted(
        setting
        for setting, key in training_settings().items()
        if not (covers(params, key) or key == PER_MODEL and PER_MODEL in params)
    )
    assert not missing, f"dvc.yaml stage 'train' does not list {missing} in params: editing them re-runs nothing"


def test_every_training_setting_is_written_in_params_yaml():
    # what a training reads is visible where a user edits it, not only as a default in config.py
    unwritten = sorted(
        key
        for key in training_settings().values()
        if key != PER_MODEL and key.split(".")[1] not in PARAMS[key.split(".")[0]]
    )
    assert not unwritten, f"params.yaml does not write {unwritten}"
    for model, overrides in PARAMS["per_model"].items():
        if model.endswith("_attrs"):
            assert set(ATTRIBUTE_SETTINGS) <= set(overrides), (
                f"params.yaml: per_model.{model} lacks {ATTRIBUTE_SETTINGS}"
            )


def sections_read(cmd: str) -> set[str]:
    """The params.yaml sections (and keys: "model.max_set_size") a command's code reads through `cfg.`."""
    handler = build_parser().parse_args(command_args(cmd)).handler.__name__
    trees = [*cli_functions(handler)] + [import_graph.tree(m) for m in modules_run_by(cmd) if m != "cli"]
    read = set()
    for tree in trees:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "cfg"
                and node.attr.rstrip("_") in SECTIONS
            ):
                read.add(node.attr.rstrip("_"))
    return read - set(NOT_RESULT_SECTIONS) - {"train", "model", "per_model"}


@pytest.mark.parametrize("name", sorted(set(STAGES) - {"train"}))
def test_every_other_stage_lists_the_sections_its_code_reads(name):
    params = stage_params(name)
    missing = sorted(
        section
        for section in sections_read(STAGES[name]["cmd"])
        if not covers(params, section) and (name, section) not in ELSEWHERE
    )
    assert not missing, f"dvc.yaml stage '{name}' reads params.yaml's {missing} but does not list them in params"


def test_the_check_fails_on_an_omitted_setting(monkeypatch):
    # the trainings' check must be able to fail: without train.history_dropout in the stage's params
    train = dict(STAGES["train"], params=[p for p in stage_params("train") if p != "train.history_dropout"])
    assert len(train["params"]) == len(stage_params("train")) - 1
    monkeypatch.setitem(STAGES, "train", train)
    with pytest.raises(AssertionError, match="train.history_dropout"):
        test_a_training_lists_every_setting_that_changes_its_result()
