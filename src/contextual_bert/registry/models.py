"""The model registry: every trained (model, seed) a version of one model.

register: each run under models/ that has been evaluated becomes a version of `mlflow.model_name`, from the
pyfunc logged out of its MLflow training run (`serving.log_pyfunc_model`), tagged with model, seed, the
features it was trained on, its validation/test metrics and the digest of its files (registry/integrity.py).
Re-running it finds the version by run id and only refreshes the tags, so a run is never registered twice.
Which version serves (alias 'champion') is decided by `promotion.py`.

The tags are the promoter's record: on a server with the `contextual-bert-auth` app only a user with MANAGE
(the stack's promoter, which runs register and promote) may write them, so `register` checks for MANAGE
first, as `promote` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from contextual_bert.config import CURVE_FILE, Config
from contextual_bert.registry.integrity import (
    DIGEST_TAG,
    IntegrityError,
    files_uri,
    manifest,
    stored_digest,
    version_files_uri,
)
from contextual_bert.registry.manage import require_manage
from contextual_bert.registry.tracking import (
    MODEL_TAG,
    client,
    directory_sha256,
    experiment_id,
    file_sha256,
    find_run,
    metric_key,
    numeric_items,
)

REGISTRY_REPORT = "registry.json"


# --- register -------------------------------------------------------------------------------------------


def _ensure_registered_model(mlflow_client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.get_registered_model(name)
    except MlflowException:
        try:
            mlflow_client.create_registered_model(
                name, description="Contextual BERT outfit completion: partial outfit + customer context -> articles"
            )
        except MlflowException:  # created by another process meanwhile
            mlflow_client.get_registered_model(name)


def _training_run(mlflow_client, cfg: Config, model: str, seed: int, model_dir: Path):
    """The MLflow run of this training: from mlflow_run.json, else the run logged for the same checkpoint,
    else a run logged now from the files (a model trained elsewhere, e.g. pulled from a DVC remote)."""
    from contextual_bert.registry.tracking import (
        features_lineage,
        log_epochs,
        log_params,
        log_run_artifacts,
        training_params,
    )

    checkpoint_sha = file_sha256(model_dir / "checkpoint.pt")
    run = find_run(mlflow_client, model_dir)
    if run is not None:
        return run, checkpoint_sha
    exp_id = experiment_id(mlflow_client, cfg.mlflow.experiment)
    found = mlflow_client.search_runs(
        [exp_id], filter_string=f"tags.checkpoint_sha256 = '{checkpoint_sha}'", max_results=1
    )
    if found:
        return found[0], checkpoint_sha
    run = mlflow_client.create_run(
        exp_id,
        run_name=f"{model}-s{seed}",
        tags={
            MODEL_TAG: model,
            "seed": str(seed),
            "logged_after_training": "true",
            "checkpoint_sha256": checkpoint_sha,
            **features_lineage(cfg.paths.features_dir),
        },
    )
    run_id = run.info.run_id
    log_params(mlflow_client, run_id, training_params(cfg, model, seed))
    curve = model_dir / CURVE_FILE
    if curve.exists():
        log_epochs(mlflow_client, run_id, json.loads(curve.read_text()))
    log_run_artifacts(mlflow_client, run_id, model_dir, cfg.paths.features_dir, cfg)
    mlflow_client.set_terminated(run_id, status="FINISHED")
    return mlflow_client.get_run(run_id), checkpoint_sha


def _logged_pyfunc(mlflow_client, cfg: Config, run, model_dir: Path):
    """A pyfunc LoggedModel of the run, logged now from model_dir's checkpoint and this checkout's code.

    Never one found in the experiment: a trainer may log models there (EDIT), and what is registered must be
    what the registering party logged. (A register that failed after logging leaves a spare logged model.)
    """
    from mlflow.entities import LoggedModelOutput

    from contextual_bert.serving.completer import example_request, log_pyfunc_model

    run_id, exp_id = run.info.run_id, run.info.experiment_id
    logged = mlflow_client.create_logged_model(exp_id, name=cfg.mlflow.model_name, source_run_id=run_id)
    log_pyfunc_model(
        model_dir / "checkpoint.pt",
        cfg.paths.features_dir,
        model_name=cfg.mlflow.model_name,
        top_k=cfg.mlflow.top_k,
        model_id=logged.model_id,
        input_example=example_request(cfg.paths.features_dir),
    )
    mlflow_client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    return logged.model_id


def logged_files(checkpoint_sha: str) -> dict[str, str]:
    """SHA-256 of the files of a pyfunc logged here that must be ours, by their path in the stored model: the
    checkpoint, the model's code file and the package it ships (the rest is MLflow's metadata)."""
    import tempfile

    from contextual_bert.data.feature_store import file_sha256
    from contextual_bert.serving.completer import PYFUNC_CODE, _package_copy

    with tempfile.TemporaryDirectory() as tmp:  # the package exactly as log_pyfunc_model ships it
        package = _package_copy(Path(tmp))
        code = {f"code/{package.name}/{path}": sha for path, sha in manifest(package).items()}
    return {"artifacts/checkpoint.pt": checkpoint_sha, PYFUNC_CODE.name: file_sha256(PYFUNC_CODE), **code}


def register_run(mlflow_client, cfg: Config, model: str, seed: int, features_sha: str) -> dict:
    """Register one evaluated training as a version (or find its version); its summary."""
    from mlflow.exceptions import MlflowException

    model_dir = cfg.run_dir(model, seed)
    eval_file = cfg.eval_path(f"{model}-s{seed}")
    if not (model_dir / "checkpoint.pt").exists():
        return {"model": model, "seed": seed, "skipped": f"{model_dir / 'checkpoint.pt'} not found (not trained)"}
    if not eval_file.exists():
        return {"model": model, "seed": seed, "skipped": f"{eval_file} not found (not evaluated)"}
    report = json.loads(eval_file.read_text())
    run, checkpoint_sha = _training_run(mlflow_client, cfg, model, seed, model_dir)
    run_id = run.info.run_id
    trained_on = run.data.tags.get("features_sha256", features_sha)
    if trained_on != features_sha:  # the served model bundles today's vocabularies: they must be its own
        return {
            "model": model,
            "seed": seed,
            "run_id": run_id,
            "skipped": f"trained on other features than {cfg.paths.features_dir} now holds; train it again",
        }
    name = cfg.mlflow.model_name
    tags = {
        MODEL_TAG: model,
        "seed": str(seed),
        "run_id": run_id,
        "features_sha256": features_sha,
        "checkpoint_sha256": checkpoint_sha,
    }
    for split in ("val", "test"):
        tags.update({metric_key(k, split): repr(v) for k, v in numeric_items(report.get(split, {})).items()})

    versions = mlflow_client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    created = not versions
    if versions:
        version = min(versions, key=lambda v: int(v.version))
        recorded = (version.tags or {}).get(DIGEST_TAG)
        try:  # a version registered before digests: vouched for only if its files are this checkout's
            tags[DIGEST_TAG] = recorded or stored_digest(
                version_files_uri(mlflow_client, name, version), logged_files(checkpoint_sha)
            )
        except (IntegrityError, MlflowException):
            return {
                "model": model,
                "seed": seed,
                "version": int(version.version),
                "run_id": run_id,
                "skipped": f"version {version.version} was registered without a digest and its files are not this "
                "checkout's checkpoint and code; it cannot be vouched for (train it again)",
            }
    else:
        model_id = _logged_pyfunc(mlflow_client, cfg, run, model_dir)
        tags[DIGEST_TAG] = stored_digest(files_uri(mlflow_client, model_id), logged_files(checkpoint_sha))
        version = mlflow_client.create_model_version(
            name,
            source=f"models:/{model_id}",
            run_id=run_id,
            tags=tags,
            model_id=model_id,
            description=f"{model}, seed {seed}: run {run_id}",
        )
    # Only the tags that changed (a re-evaluation): one request each, 27 per version, took 20 of the
    # register stage's 28 s in make repro.
    for key, value in tags.items():
        if (version.tags or {}).get(key) != value:
            mlflow_client.set_model_version_tag(name, version.version, key, value)
    return {
        "model": model,
        "seed": seed,
        "version": int(version.version),
        "run_id": run_id,
        "created": created,
        "val": report.get("val", {}),
        "test": report.get("test", {}),
    }


def register_all(cfg: Config) -> dict:
    """Register every model x seed of params' train section; writes reports/registry.json."""
    mlflow_client = client(cfg.mlflow)
    _ensure_registered_model(mlflow_client, cfg.mlflow.model_name)
    require_manage(mlflow_client, cfg.mlflow.model_name, "register", "to write the versions' record")
    features_sha = directory_sha256(cfg.paths.features_dir)
    entries = [
        register_run(mlflow_client, cfg, model, seed, features_sha)
        for model in cfg.train.models
        for seed in cfg.train.seeds
    ]
    result = {"model_name": cfg.mlflow.model_name, "features_sha256": features_sha, "versions": entries}
    write_report(cfg, REGISTRY_REPORT, result)
    return result


def write_report(cfg: Config, name: str, payload: dict) -> Path:
    path = cfg.paths.reports_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path
