import json
from pathlib import Path

import pytest
import torch
from helpers import STRONG, WEAK
from helpers import with_registry_settings as _with

from contextual_bert.registry.models import register_all
from contextual_bert.registry.tracking import client, directory_sha256, read_run_file

# --- register --------------------------------------------------------------------------------------------


def test_register_makes_one_tagged_version_per_run_and_is_idempotent(tiny_trained_runs):
    cfg = _with(tiny_trained_runs.cfg, "registry-idempotent", [STRONG[0], WEAK[0]])
    first = register_all(cfg)
    assert [(e["model"], e["created"]) for e in first["versions"]] == [(STRONG[0], True), (WEAK[0], True)]
    again = register_all(cfg)
    assert [(e["version"], e["created"]) for e in again["versions"]] == [
        (e["version"], False) for e in first["versions"]
    ]

    mlflow_client = client(cfg.mlflow)
    versions = mlflow_client.search_model_versions(f"name = '{cfg.mlflow.model_name}'")
    assert len(versions) == 2
    for entry in first["versions"]:
        version = mlflow_client.get_model_version(cfg.mlflow.model_name, str(entry["version"]))
        run_dir = cfg.paths.models_dir / f"{entry['model']}-s{entry['seed']}"
        assert version.run_id == read_run_file(run_dir)["run_id"]
        evaluation = json.loads((cfg.paths.reports_dir / "eval" / f"{entry['model']}-s0.json").read_text())
        assert version.tags["model"] == entry["model"] and version.tags["seed"] == "0"
        assert float(version.tags["val/recall_at_5"]) == pytest.approx(evaluation["val"]["recall@5"])
        assert float(version.tags["test/recall_at_1"]) == pytest.approx(evaluation["test"]["recall@1"])
        assert version.tags["features_sha256"] == directory_sha256(cfg.paths.features_dir)
    assert json.loads((cfg.paths.reports_dir / "registry.json").read_text())["versions"] == again["versions"]


def test_registering_again_sets_only_the_tags_that_changed(tiny_trained_runs, tmp_path, monkeypatch):
    """A re-evaluation reaches the version's tags; the unchanged ones cost no request."""
    import shutil

    from mlflow import MlflowClient

    cfg = _with(tiny_trained_runs.cfg, "registry-retag", [STRONG[0]])
    reports = tmp_path / "reports"
    shutil.copytree(cfg.paths.reports_dir / "eval", reports / "eval")
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"reports_dir": reports})})
    entry = register_all(cfg)["versions"][0]
    eval_file = cfg.eval_path(f"{STRONG[0]}-s0")
    report = json.loads(eval_file.read_text())
    report["test"]["recall@1"] = 0.5
    eval_file.write_text(json.dumps(report))

    set_tag, keys = MlflowClient.set_model_version_tag, []
    monkeypatch.setattr(
        MlflowClient,
        "set_model_version_tag",
        lambda self, name, version, key, value: keys.append(key) or set_tag(self, name, version, key, value),
    )
    again = register_all(cfg)["versions"][0]
    assert (again["version"], again["created"]) == (entry["version"], False)
    assert keys == ["test/recall_at_1"]
    version = client(cfg.mlflow).get_model_version(cfg.mlflow.model_name, str(entry["version"]))
    assert float(version.tags["test/recall_at_1"]) == 0.5


def test_register_skips_what_was_not_trained_and_says_so(tiny_trained_runs):
    cfg = _with(tiny_trained_runs.cfg, "registry-skips", ["concat"])
    result = register_all(cfg)
    assert "not trained" in result["versions"][0]["skipped"]


def test_a_model_trained_without_tracking_gets_a_run_when_registered(tiny_trained_runs, tmp_path):
    """A run folder with no mlflow_run.json (e.g. pulled from a DVC remote) is logged at registration."""
    import shutil

    cfg = tiny_trained_runs.cfg
    models = tmp_path / "models"
    shutil.copytree(cfg.paths.models_dir / "none-s0", models / "none-s0")
    (models / "none-s0" / "mlflow_run.json").unlink()
    # A checkpoint of its own, so registration cannot find the original run by its hash either.
    payload = torch.load(models / "none-s0" / "checkpoint.pt", weights_only=True)
    payload["meta"]["copied"] = True
    torch.save(payload, models / "none-s0" / "checkpoint.pt")
    cfg = _with(cfg, "registry-untracked", [WEAK[0]])
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"models_dir": models})})
    entry = register_all(cfg)["versions"][0]
    run = client(cfg.mlflow).get_run(entry["run_id"])
    assert run.data.tags["logged_after_training"] == "true" and run.info.status == "FINISHED"
    assert run.data.params["model"] == WEAK[0] and "train_loss" in run.data.metrics
    assert register_all(cfg)["versions"][0]["version"] == entry["version"]  # found again by checkpoint hash


def test_a_run_trained_on_other_features_is_not_registered(tiny_trained_runs, tmp_path):
    """Its pyfunc would bundle today's vocabularies with weights fit to others."""
    import shutil

    from contextual_bert.registry.tracking import experiment_id, write_run_file

    cfg = tiny_trained_runs.cfg
    models = tmp_path / "models"
    shutil.copytree(cfg.paths.models_dir / "none-s0", models / "none-s0")
    mlflow_client = client(cfg.mlflow)
    exp_id = experiment_id(mlflow_client, cfg.mlflow.experiment)
    run = mlflow_client.create_run(exp_id, tags={"features_sha256": "0" * 64})
    write_run_file(models / "none-s0", run.info.run_id, exp_id, "")
    cfg = _with(cfg, "registry-other-features", [WEAK[0]])
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"models_dir": models})})
    entry = register_all(cfg)["versions"][0]
    assert "trained on other features" in entry["skipped"] and "version" not in entry


def test_register_records_a_digest_of_the_stored_files_and_a_changed_file_is_refused(tiny_trained_runs, tmp_path):
    """The digest is of the files as stored; one byte changed in the store and nothing of the version loads;
    a version registered before digests is vouched for again only while its files are this checkout's."""
    from contextual_bert.registry.integrity import (
        DIGEST_TAG,
        IntegrityError,
        download,
        manifest_sha256,
        verified_copy,
        version_files_uri,
    )

    cfg = _with(tiny_trained_runs.cfg, "registry-digest", [STRONG[0]])
    entry = register_all(cfg)["versions"][0]
    mlflow_client = client(cfg.mlflow)
    name = cfg.mlflow.model_name
    version = mlflow_client.get_model_version(name, str(entry["version"]))
    stored = download(version_files_uri(mlflow_client, name, version), tmp_path / "stored")
    assert version.tags[DIGEST_TAG] == manifest_sha256(stored)
    assert (stored / "pyfunc_model.py").exists() and (stored / "code/contextual_bert/serving/completer.py").exists()

    mlflow_client.delete_model_version_tag(name, version.version, DIGEST_TAG)  # as registered before digests
    assert register_all(cfg)["versions"][0]["version"] == entry["version"]
    version = mlflow_client.get_model_version(name, version.version)
    assert version.tags[DIGEST_TAG] == manifest_sha256(stored)

    # the store is a local directory here: change the model's code where it lies
    location = version_files_uri(mlflow_client, name, version).removeprefix("file://")
    code = Path(location) / "code/contextual_bert/serving/completer.py"
    code.write_text(code.read_text() + "\n# changed\n")
    with pytest.raises(IntegrityError, match="changed after registration"):
        verified_copy(mlflow_client, name, version, tmp_path / "check")
    mlflow_client.delete_model_version_tag(name, version.version, DIGEST_TAG)
    assert "cannot be vouched for" in register_all(cfg)["versions"][0]["skipped"]
    with pytest.raises(IntegrityError, match="no 'artifacts_sha256' tag"):
        verified_copy(mlflow_client, name, mlflow_client.get_model_version(name, version.version), tmp_path / "c2")
