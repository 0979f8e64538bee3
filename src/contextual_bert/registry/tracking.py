"""MLflow tracking of trainings and evaluations: params, per-epoch and final metrics, lineage, artifacts.

One MLflow run per training (model, seed). Its id is kept in ``models/<model>-s<seed>/mlflow_run.json``
so that evaluate and register find it. The tracking URI is ``mlflow.tracking_uri`` from params
(``sqlite:///mlflow.db`` in the repository root), overridden by the ``MLFLOW_TRACKING_URI`` environment
variable. A SQLite file takes one writer at a time: trainings that run at once must log through one
``mlflow server --backend-store-uri sqlite:///mlflow.db`` (set ``MLFLOW_TRACKING_URI=http://...``).

Lineage, stated for what it is: the git commit (and whether the work tree had uncommitted changes to
tracked files), a SHA-256 of every file under the features directory computed here, the md5 DVC recorded
for ``data/features`` in ``dvc.lock`` when that file holds it (DVC's own hash, as last locked, not recomputed),
and the SHA-256 input hashes that the features stage wrote into ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contextual_bert.config import CHECKPOINT_FILE, CURVE_FILE, METRICS_FILE, NOT_APPLICABLE, Config, MlflowConfig
from contextual_bert.data.feature_store import (
    CATALOGUE_FEATURE_FILES,
    CUSTOMERS_FILE,
    MANIFEST_FILE,
    MODEL_FEATURE_FILES,
    file_sha256,
)
from contextual_bert.errors import ContextualBertError

RUN_FILE = "mlflow_run.json"
# The vocabularies and context tables of the features stage (not the encoded outfits: the data, not the model).
RUN_ARTIFACT_FEATURE_FILES = (*MODEL_FEATURE_FILES, *CATALOGUE_FEATURE_FILES, CUSTOMERS_FILE)  # those present
RUN_ARTIFACT_MODEL_FILES = (CHECKPOINT_FILE, CURVE_FILE, METRICS_FILE)
# A training run's and a registered version's tag naming the model ("none", "bag_of_items_attrs"), and the
# tag that named it before issue 92: still read, so that runs and versions logged before keep working.
MODEL_TAG, OLD_MODEL_TAG = "model", "variant"


def model_tag(tags: dict | None) -> str | None:
    """The model a run's or a version's tags name: its MODEL_TAG, else (logged before issue 92) OLD_MODEL_TAG."""
    tags = tags or {}
    return tags.get(MODEL_TAG, tags.get(OLD_MODEL_TAG))


# --- where to log ---------------------------------------------------------------------------------------


def tracking_uri(cfg: MlflowConfig) -> str:
    """MLFLOW_TRACKING_URI when set, else params' mlflow.tracking_uri."""
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking_uri


def client(cfg: MlflowConfig):
    """An MlflowClient on the resolved tracking URI (the model registry lives in the same store), whose calls
    ride out a transient failure of the request itself (`Retrying`)."""
    import mlflow

    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return Retrying(mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri))


TRANSIENT = re.compile(r"^API request to \S+ failed with (timeout )?exception")  # mlflow.utils.rest_utils' words
RETRY_DELAYS_S = (0.5, 2.0, 8.0)


def is_transient(exc: BaseException) -> bool:
    """A request that never got an answer (connection refused or reset, a timeout, an error inside the client):
    MLflow's own retries cover the HTTP statuses, not these. An answer the server gave is never retried."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and bool(TRANSIENT.match(exc.message))


class Retrying:
    """An MlflowClient whose methods are tried again, after RETRY_DELAYS_S, when a call fails transiently: one
    lost request must not fail a training of minutes. (A retried write that did reach the server is logged
    twice at worst: a metric step, a tag set again.)"""

    def __init__(self, inner, delays_s: tuple[float, ...] = RETRY_DELAYS_S):
        self._inner, self._delays_s = inner, delays_s

    def __getattr__(self, name: str):
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            for delay in self._delays_s:
                try:
                    return attribute(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - only a transient one is retried
                    if not is_transient(exc):
                        raise
                    time.sleep(delay)
            return attribute(*args, **kwargs)

        return call


def artifact_location(uri: str, experiment: str) -> str | None:
    """For a SQLite store: artifacts in mlruns/<experiment>/ beside the database file (MLflow's default is
    ./mlruns of whatever the working directory is). For a server: None, the server decides."""
    if not uri.startswith("sqlite:///"):
        return None
    db_path = Path(uri[len("sqlite:///") :])
    return (db_path.resolve().parent / "mlruns" / re.sub(r"[^\w.\-]", "_", experiment)).as_uri()


def experiment_id(mlflow_client, name: str) -> str:
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        location = artifact_location(mlflow_client.tracking_uri, name)
        return mlflow_client.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


# --- names and values MLflow accepts --------------------------------------------------------------------


def metric_key(name: str, prefix: str = "") -> str:
    """An MLflow-safe metric/tag key: 'recall@5' -> 'recall_at_5', prefixed as 'val/recall_at_5'.

    Evaluation metrics are prefixed by split ('val/', 'test/'), train's result by 'final/'; per-epoch
    metrics keep curve.json's names ('val_cross_entropy'), so the two never share a key.
    """
    key = re.sub(r"[^\w.\- /:]", "_", name.replace("@", "_at_"))
    return f"{prefix}/{key}" if prefix else key


def flatten(obj, prefix: str = "") -> dict[str, object]:
    """Nested dicts -> {'a.b.c': value}; lists stay values."""
    out: dict[str, object] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.update(flatten(value, name))
    else:
        out[prefix] = obj
    return out


def numeric_items(values: dict) -> dict[str, float]:
    """The finite numbers of a flat dict (booleans and strings are not metrics)."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def training_params(cfg: Config, model: str, seed: int) -> dict[str, str]:
    """What a training depends on in params.yaml, flattened: its model, train and features sections."""
    sections = {
        "model": cfg.model_for(model).model_dump(mode="json"),
        "train": cfg.train_for(model).read_by(model, exclude={"models", "seeds"}),
        "features": cfg.features.model_dump(mode="json"),
    }
    params = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(sections).items()}
    params.update(model=model, seed=str(seed))
    return params


# --- lineage --------------------------------------------------------------------------------------------


def git_state(repo: Path = Path(".")) -> dict[str, str]:
    """{'git_commit': sha or 'unknown', 'git_dirty': 'true'/'false'/'unknown'}."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"git_commit": "unknown", "git_dirty": "unknown"}
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": head.stdout.strip(), "git_dirty": str(bool(status.stdout.strip())).lower()}


def directory_sha256(directory: Path) -> str:
    """SHA-256 over the relative paths and contents of every file under `directory`, in sorted order."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def dvc_locked_md5(out_path: Path, lock_file: Path = Path("dvc.lock")) -> str | None:
    """The md5 DVC recorded in dvc.lock for an output path (a '.dir' hash for folders), if any."""
    if not lock_file.exists():
        return None
    try:
        # libyaml when PyYAML has it: make repro's dvc.lock parses in 0.04 s instead of ~0.8 s
        lock = yaml.load(lock_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError:
        return None
    wanted = Path(out_path).as_posix().rstrip("/")
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs", []) or []:
            if str(out.get("path", "")).rstrip("/") == wanted:
                return out.get("md5")
    return None


def features_lineage(features_dir: Path) -> dict[str, str]:
    """Tags that say which features a model was trained on (see the module docstring)."""
    features_dir = Path(features_dir)
    tags = {"features_sha256": directory_sha256(features_dir)}
    locked = dvc_locked_md5(features_dir)
    tags["dvc_lock_features_md5"] = locked or "absent"
    manifest = features_dir / MANIFEST_FILE
    if manifest.exists():
        inputs = json.loads(manifest.read_text()).get("inputs", {})
        for name, sha in inputs.items():
            tags[f"features_input_sha256.{name}"] = str(sha)
    return tags


# --- the run file beside the checkpoints ----------------------------------------------------------------


def write_run_file(run_dir: Path, run_id: str, experiment_id_: str, uri: str) -> Path:
    path = Path(run_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id, "experiment_id": experiment_id_, "tracking_uri": uri}, indent=2))
    return path


def read_run_file(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        record["run_id"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ContextualBertError(
            f"{path}: not a valid MLflow run file (expected a JSON object with 'run_id')"
        ) from None
    return record


def find_run(mlflow_client, run_dir: Path):
    """The MLflow run recorded in run_dir/mlflow_run.json, or None when there is no file or no such run."""
    record = read_run_file(run_dir)
    if record is None:
        return None
    from mlflow.exceptions import MlflowException

    try:
        return mlflow_client.get_run(record["run_id"])
    except MlflowException:
        return None


# --- logging a training ---------------------------------------------------------------------------------


@dataclass
class TrainingTracker:
    """Logs one training to its MLflow run: call `log_epoch` from train's `on_epoch_end`, then `log_result`."""

    mlflow_client: Any  # an mlflow.MlflowClient (mlflow is imported where it is used: its import is slow)
    run_id: str
    run_dir: Path
    features_dir: Path
    cfg: Config
    params_file: Path | None = None

    def log_epoch(self, epoch: int, row: dict) -> None:
        log_epochs(self.mlflow_client, self.run_id, [row], first_step=int(epoch))

    def log_result(self, result: dict) -> None:
        """Epochs of curve.json not logged yet (a resumed training), final metrics, then the artifacts."""
        from mlflow.entities import Metric

        curve_path = self.run_dir / CURVE_FILE
        if curve_path.exists():
            logged = {m.step for m in self.mlflow_client.get_metric_history(self.run_id, "train_loss")}
            curve = json.loads(curve_path.read_text())
            missing = [row for step, row in enumerate(curve, 1) if int(row.get("epoch", step)) not in logged]
            log_epochs(self.mlflow_client, self.run_id, missing)
        now = _now_ms()
        values = numeric_items(flatten(result))
        metrics = [Metric(metric_key(k, "final"), v, now, 0) for k, v in values.items()]
        if metrics:
            self.mlflow_client.log_batch(self.run_id, metrics=metrics)
        if NOT_APPLICABLE in result:  # this data cannot train the model: said in the UI too
            self.mlflow_client.set_tag(self.run_id, NOT_APPLICABLE, result[NOT_APPLICABLE])
        if "converged" in result:  # how it converged, or "no": a tag to filter runs by in the MLflow UI
            self.mlflow_client.set_tag(self.run_id, "converged", result["converged"] or "no")
        checkpoint = self.run_dir / "checkpoint.pt"
        if checkpoint.exists():  # lets register find this run from the checkpoint alone
            self.mlflow_client.set_tag(self.run_id, "checkpoint_sha256", file_sha256(checkpoint))
        log_run_artifacts(self.mlflow_client, self.run_id, self.run_dir, self.features_dir, self.cfg, self.params_file)


def log_epochs(mlflow_client, run_id: str, rows: list[dict], first_step: int = 1) -> None:
    """History rows as metrics, step = the row's 'epoch' (else its position from first_step)."""
    from mlflow.entities import Metric

    now = _now_ms()
    metrics = []
    for position, row in enumerate(rows):
        values = numeric_items(flatten(row))
        step = int(values.pop("epoch", first_step + position))
        metrics += [Metric(metric_key(k), v, now, step) for k, v in values.items()]
    for start in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics per call
        mlflow_client.log_batch(run_id, metrics=metrics[start : start + 1000])


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def log_run_artifacts(
    mlflow_client, run_id: str, run_dir: Path, features_dir: Path, cfg: Config, params_file: Path | None = None
) -> None:
    """Checkpoint, history and metrics; the context tables and article vocabulary; the config (resolved, and
    the params file as written when given)."""
    for name in RUN_ARTIFACT_MODEL_FILES:
        if (Path(run_dir) / name).exists():
            mlflow_client.log_artifact(run_id, str(Path(run_dir) / name), "model")
    for name in RUN_ARTIFACT_FEATURE_FILES:
        if (Path(features_dir) / name).exists():
            mlflow_client.log_artifact(run_id, str(Path(features_dir) / name), "features")
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp) / "params.resolved.json"
        resolved.write_text(json.dumps(cfg.model_dump(mode="json", by_alias=True), indent=2))
        mlflow_client.log_artifact(run_id, str(resolved), "config")
    if params_file is not None and Path(params_file).exists():
        mlflow_client.log_artifact(run_id, str(params_file), "config")


def log_params(mlflow_client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for start in range(0, len(items), 100):  # log_batch takes at most 100 params per call
        mlflow_client.log_batch(run_id, params=items[start : start + 100])


def _same_training_run(mlflow_client, run_dir: Path, params: dict[str, str], features_sha: str):
    """The run of mlflow_run.json when it logged this very training (same params and features) and the
    training can resume (last.pt is there): it goes on logging there instead of opening a second run."""
    if not (Path(run_dir) / "last.pt").exists():  # training starts from scratch: a run of its own
        return None
    run = find_run(mlflow_client, run_dir)
    if run is None or run.info.lifecycle_stage != "active":
        return None
    if run.data.params != params or run.data.tags.get("features_sha256") != features_sha:
        return None
    return run


@contextmanager
def track_training(
    cfg: Config, model: str, seed: int, run_dir: Path, params_file: Path | None = None
) -> Iterator[TrainingTracker]:
    """One MLflow run around a training; marks it FAILED (and re-raises) when the training raises.

    The run id is written to run_dir/mlflow_run.json before training starts, so a crashed run is findable
    and its resumption logs to the same run.
    """
    mlflow_client = client(cfg.mlflow)
    exp_id = experiment_id(mlflow_client, cfg.mlflow.experiment)
    features_dir = cfg.paths.features_dir
    params = training_params(cfg, model, seed)
    lineage = features_lineage(features_dir)
    run = _same_training_run(mlflow_client, run_dir, params, lineage["features_sha256"])
    if run is not None:
        run_id = run.info.run_id
        mlflow_client.update_run(run_id, status="RUNNING")
        mlflow_client.set_tag(run_id, "resumed", "true")
    else:
        tags = {
            MODEL_TAG: model,
            "seed": str(seed),
            "mlflow.source.name": "contextual-bert train",
            "mlflow.source.type": "LOCAL",
            **git_state(),
            **lineage,
        }
        if tags["git_commit"] != "unknown":
            tags["mlflow.source.git.commit"] = tags["git_commit"]
        run_id = mlflow_client.create_run(exp_id, tags=tags, run_name=f"{model}-s{seed}").info.run_id
        log_params(mlflow_client, run_id, params)
    write_run_file(run_dir, run_id, exp_id, tracking_uri(cfg.mlflow))
    tracker = TrainingTracker(mlflow_client, run_id, Path(run_dir), Path(features_dir), cfg, params_file)
    try:
        yield tracker
    except KeyboardInterrupt:
        mlflow_client.set_terminated(run_id, status="KILLED")
        raise
    except BaseException:
        mlflow_client.set_terminated(run_id, status="FAILED")
        raise
    mlflow_client.set_terminated(run_id, status="FINISHED")


# --- logging an evaluation ------------------------------------------------------------------------------


def log_evaluation(cfg: Config, run_dir: Path, report: dict, report_path: Path | None = None) -> str | None:
    """Log an evaluation's split metrics ('test/recall_at_5', ...) to the training's run; its id, or None.

    Returns None (and logs nothing) when run_dir holds no mlflow_run.json: the model was not tracked.
    """
    record = read_run_file(run_dir)
    if record is None:
        return None
    from mlflow.entities import Metric, RunTag
    from mlflow.exceptions import MlflowException

    mlflow_client = client(cfg.mlflow)
    now = _now_ms()
    metrics = []
    for split in ("val", "test"):
        values = report.get(split)
        if isinstance(values, dict):
            metrics += [Metric(metric_key(k, split), v, now, 0) for k, v in numeric_items(values).items()]
    verdict = report.get("yardstick") or {}  # evaluation.yardstick: where the model stands against its count
    tags = (
        [RunTag("yardstick", str(verdict["name"])), RunTag("yardstick_verdict", str(verdict.get("verdict")))]
        if verdict
        else []
    )
    try:
        if metrics or tags:
            mlflow_client.log_batch(record["run_id"], metrics=metrics, tags=tags)
        if report_path is not None and Path(report_path).exists():
            mlflow_client.log_artifact(record["run_id"], str(report_path), "eval")
    except MlflowException as exc:
        raise ContextualBertError(
            f"{Path(run_dir) / RUN_FILE}: cannot log to MLflow run {record['run_id']} at "
            f"{tracking_uri(cfg.mlflow)} ({exc.message.splitlines()[0]}); the run was logged to "
            f"{record.get('tracking_uri', '?')}"
        ) from None
    return record["run_id"]
