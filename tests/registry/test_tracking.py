import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from helpers import STRONG, WEAK, free_port, stop_process_group, wait_for_http

from contextual_bert.config import Config, MlflowConfig
from contextual_bert.registry.tracking import (
    RUN_FILE,
    Retrying,
    artifact_location,
    client,
    directory_sha256,
    dvc_locked_md5,
    flatten,
    metric_key,
    model_tag,
    read_run_file,
    track_training,
    tracking_uri,
    training_params,
)


def _run_of(project, model, seed):
    record = read_run_file(project.cfg.paths.models_dir / f"{model}-s{seed}")
    return client(project.cfg.mlflow).get_run(record["run_id"])


def test_metric_keys_are_names_mlflow_accepts():
    assert metric_key("recall@5", "val") == "val/recall_at_5"
    assert metric_key("ndcg@10") == "ndcg_at_10"
    assert metric_key("samples/s (train)") == "samples/s _train_"


def test_flatten_nests_with_dots_and_keeps_lists():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {"a.b": 1, "a.c": [1, 2], "d": "x"}


def test_the_model_tag_is_read_under_its_old_name_too():
    """Runs and versions logged before issue 92 name their model in a "variant" tag: still read, the new tag
    first."""
    assert model_tag({"model": "concat", "seed": "0"}) == "concat"
    assert model_tag({"variant": "none", "seed": "0"}) == "none"  # an existing registry's versions
    assert model_tag({"model": "concat", "variant": "none"}) == "concat"
    assert model_tag({}) is None and model_tag(None) is None


def test_training_params_are_the_flattened_sections_with_per_model_overrides():
    cfg = Config.model_validate({"per_model": {"concat": {"learning_rate": 0.5, "dropout": 0.3}}})
    params = training_params(cfg, "concat", 2)
    assert params["model"] == "concat" and params["seed"] == "2"
    assert params["train.learning_rate"] == "0.5" and params["model.dropout"] == "0.3"
    assert params["model.d_model"] == "128" and "features.val_fraction" in params
    assert "train.models" not in params  # the matrix, not a setting of this training
    # id dropout is read by the "_attrs" models only: the paper's runs log what they logged before it existed
    assert "train.id_dropout" not in params and training_params(cfg, "concat_attrs", 2)["train.id_dropout"] == "0.0"
    assert all(isinstance(v, str) for v in params.values())


def test_environment_overrides_the_params_tracking_uri(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking_uri(MlflowConfig()) == "http://127.0.0.1:5999"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(MlflowConfig()) == "sqlite:///mlflow.db"


def test_sqlite_artifacts_live_beside_the_database(tmp_path):
    assert (
        artifact_location(f"sqlite:///{tmp_path}/m.db", "contextual-bert")
        == (tmp_path / "mlruns" / "contextual-bert").as_uri()
    )
    assert artifact_location(f"sqlite:///{tmp_path}/m.db", "a b/c").endswith("/mlruns/a_b_c")
    assert artifact_location("http://127.0.0.1:5000", "contextual-bert") is None


def test_dvc_locked_md5_reads_the_features_output(tmp_path):
    lock = tmp_path / "dvc.lock"
    lock.write_text(
        yaml.safe_dump(
            {
                "schema": "2.0",
                "stages": {
                    "features": {
                        "cmd": "x",
                        "outs": [{"path": "data/features", "md5": "abc.dir", "size": 1, "nfiles": 6}],
                    }
                },
            }  # fmt: skip
        )
    )
    assert dvc_locked_md5(Path("data/features"), lock) == "abc.dir"
    assert dvc_locked_md5(Path("data/raw"), lock) is None
    assert dvc_locked_md5(Path("data/features"), tmp_path / "absent.lock") is None


def test_a_cli_training_is_one_finished_run_with_params_epochs_lineage_and_artifacts(tiny_trained_runs):
    project, cfg = tiny_trained_runs, tiny_trained_runs.cfg
    model, seed = STRONG
    run = _run_of(project, model, seed)
    mlflow_client = client(cfg.mlflow)
    assert run.info.status == "FINISHED"
    experiment = mlflow_client.get_experiment(run.info.experiment_id)
    assert experiment.name == cfg.mlflow.experiment
    assert experiment.artifact_location == artifact_location(os.environ["MLFLOW_TRACKING_URI"], experiment.name)
    assert run.data.params == training_params(cfg, model, seed)

    history = json.loads((cfg.paths.models_dir / f"{model}-s{seed}" / "curve.json").read_text())
    for key in ("train_loss", "val_cross_entropy", "learning_rate"):
        logged = mlflow_client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in logged) == [row["epoch"] for row in history], key
        assert [m.value for m in sorted(logged, key=lambda m: m.step)] == pytest.approx([r[key] for r in history])
    metrics = run.data.metrics
    final = json.loads((cfg.paths.models_dir / f"{model}-s{seed}" / "metrics.json").read_text())
    assert metrics["final/best_val_cross_entropy"] == pytest.approx(final["best_val_cross_entropy"])
    evaluation = json.loads((cfg.paths.reports_dir / "eval" / f"{model}-s{seed}.json").read_text())
    assert metrics["val/recall_at_5"] == pytest.approx(evaluation["val"]["recall@5"])
    assert metrics["test/cross_entropy"] == pytest.approx(evaluation["test"]["cross_entropy"])

    tags = run.data.tags
    assert tags["model"] == model and tags["seed"] == str(seed)
    assert len(tags["git_commit"]) == 40 and tags["git_dirty"] in ("true", "false")
    assert tags["features_sha256"] == directory_sha256(project.features_dir)
    assert tags["dvc_lock_features_md5"] == "absent"  # the tiny project has no dvc.lock
    manifest = json.loads((project.features_dir / "manifest.json").read_text())
    assert {f"features_input_sha256.{k}": v for k, v in manifest["inputs"].items()}.items() <= tags.items()

    artifacts = {
        f.path for d in ("model", "features", "config") for f in mlflow_client.list_artifacts(run.info.run_id, d)
    }
    assert {"model/checkpoint.pt", "model/curve.json", "features/article_vocab.parquet",
            "features/context_vocab.json", "features/customers.parquet", "features/spec.json",
            "config/params.resolved.json", "config/params.yaml"} <= artifacts  # fmt: skip
    assert {f.path for f in mlflow_client.list_artifacts(run.info.run_id, "eval")} == {f"eval/{model}-s{seed}.json"}


def test_each_training_has_its_own_run(tiny_trained_runs):
    assert _run_of(tiny_trained_runs, *STRONG).info.run_id != _run_of(tiny_trained_runs, *WEAK).info.run_id


def test_a_failing_training_marks_its_run_failed(tiny_project, tmp_path):
    cfg = tiny_project.cfg
    with pytest.raises(RuntimeError, match="boom"):
        with track_training(cfg, "concat", 7, tmp_path / "run"):
            raise RuntimeError("boom")
    run = client(cfg.mlflow).get_run(read_run_file(tmp_path / "run")["run_id"])
    assert run.info.status == "FAILED"


def test_a_resumed_training_logs_to_the_same_run_and_a_changed_or_fresh_one_to_a_new_run(tiny_project, tmp_path):
    cfg = tiny_project.cfg
    with track_training(cfg, "concat", 8, tmp_path / "run") as first:
        first.log_epoch(1, {"epoch": 1, "train_loss": 2.0})
    (tmp_path / "run" / "last.pt").write_bytes(b"resume state")  # what training leaves to resume from
    with track_training(cfg, "concat", 8, tmp_path / "run") as again:
        again.log_epoch(2, {"epoch": 2, "train_loss": 1.5})
    assert again.run_id == first.run_id
    history = client(cfg.mlflow).get_metric_history(first.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 2.0), (2, 1.5)]
    assert client(cfg.mlflow).get_run(first.run_id).info.status == "FINISHED"

    changed = cfg.model_copy(update={"train": cfg.train.model_copy(update={"learning_rate": 0.5})})
    with track_training(changed, "concat", 8, tmp_path / "run") as other:
        pass
    assert other.run_id != first.run_id
    assert read_run_file(tmp_path / "run")["run_id"] == other.run_id

    (tmp_path / "run" / "last.pt").unlink()  # nothing to resume: the same settings train afresh, in a new run
    with track_training(changed, "concat", 8, tmp_path / "run") as fresh:
        pass
    assert fresh.run_id != other.run_id


def test_a_training_extended_by_more_epochs_logs_its_whole_history_in_its_new_run(tiny_project, tmp_path):
    """max_epochs changed: training resumes from last.pt, MLflow opens a run (a param changed) and the epochs
    trained before are logged there from curve.json."""
    from contextual_bert.cli import main

    raw = yaml.safe_load(tiny_project.params.read_text())
    raw["paths"]["models_dir"] = str(tmp_path / "models")
    raw["train"]["max_epochs"] = 1
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    args = ["--params", str(params), "train", "--model", "concat", "--seed", "3"]
    assert main(args) == 0
    first = read_run_file(tmp_path / "models" / "concat-s3")["run_id"]
    raw["train"]["max_epochs"] = 2
    params.write_text(yaml.safe_dump(raw))
    assert main(args) == 0
    second = read_run_file(tmp_path / "models" / "concat-s3")["run_id"]
    assert second != first
    history = client(tiny_project.cfg.mlflow).get_metric_history(second, "train_loss")
    assert sorted(m.step for m in history) == [1, 2]


def test_the_run_file_is_beside_the_checkpoint(tiny_trained_runs):
    record = json.loads((tiny_trained_runs.cfg.paths.models_dir / "global_state-s0" / RUN_FILE).read_text())
    assert set(record) == {"run_id", "experiment_id", "tracking_uri"}
    assert record["tracking_uri"] == os.environ["MLFLOW_TRACKING_URI"]


@pytest.mark.slow
def test_three_trainings_at_once_log_through_one_mlflow_server(tiny_project, tmp_path):
    """Three `contextual-bert train` processes, one `mlflow server` on SQLite: no 'database is locked'."""
    bin_dir = Path(sys.executable).parent
    port = free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # No background job runner (MLflow's GenAI jobs: eight more processes we do not use).
    server_env = {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [
            str(bin_dir / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/server.db",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],  # fmt: skip
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", server, timeout=120)
        params = yaml.safe_load(tiny_project.params.read_text())
        params["paths"]["models_dir"] = str(tmp_path / "models")
        params["train"]["max_epochs"] = 1
        params["mlflow"]["experiment"] = "parallel"
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        train_env = {**env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "OMP_NUM_THREADS": "1"}
        trainings = [
            subprocess.Popen(
                [
                    str(bin_dir / "contextual-bert"),
                    "--params",
                    str(tmp_path / "params.yaml"),
                    "train",
                    "--model",
                    "concat",
                    "--seed",
                    str(seed),
                ],  # fmt: skip
                env=train_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in (0, 1, 2)
        ]
        outputs = [p.communicate(timeout=240) for p in trainings]
        for process, (_, err) in zip(trainings, outputs):
            assert process.returncode == 0, err[-2000:]
            assert "database is locked" not in err
        server_client = mlflow.MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
        experiment = server_client.get_experiment_by_name("parallel")
        runs = server_client.search_runs([experiment.experiment_id])
        assert sorted(r.data.params["seed"] for r in runs) == ["0", "1", "2"]
        for run in runs:
            assert run.info.status == "FINISHED"
            assert "train_loss" in run.data.metrics and "final/best_val_cross_entropy" in run.data.metrics
            assert "model/checkpoint.pt" in {f.path for f in server_client.list_artifacts(run.info.run_id, "model")}
    finally:
        stop_process_group(server)


class _Flaky:
    """An MlflowClient stand-in whose `log_batch` fails as MLflow words a request that got no answer."""

    tracking_uri = "http://127.0.0.1:1"

    def __init__(self, failures: int, message: str):
        self.failures, self.message, self.calls = failures, message, 0

    def log_batch(self, run_id):
        from mlflow.exceptions import MlflowException

        self.calls += 1
        if self.calls <= self.failures:
            raise MlflowException(self.message)
        return run_id


LOST = "API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'"


def test_a_request_that_got_no_answer_is_tried_again():
    inner = _Flaky(2, LOST)
    assert Retrying(inner, delays_s=(0, 0, 0)).log_batch("r") == "r" and inner.calls == 3
    assert Retrying(inner).tracking_uri == inner.tracking_uri


def test_retries_end_and_an_answer_is_never_retried():
    from mlflow.exceptions import MlflowException

    inner = _Flaky(9, LOST)
    with pytest.raises(MlflowException, match="failed with exception"):
        Retrying(inner, delays_s=(0, 0)).log_batch("r")
    assert inner.calls == 3
    refused = _Flaky(1, "RESOURCE_DOES_NOT_EXIST: Run 'r' not found")
    with pytest.raises(MlflowException, match="not found"):
        Retrying(refused, delays_s=(0, 0)).log_batch("r")
    assert refused.calls == 1
