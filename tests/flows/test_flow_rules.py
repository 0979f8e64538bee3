"""Rules the flows keep, checked without a server: no Prefect cache, retries only for transient faults,
the library free of Prefect, the MLflow store a checkout logs to."""

from __future__ import annotations

import http.server
import re
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from flows_testkit import REPO, free_port
from prefect import Task
from prefect.cache_policies import NO_CACHE

import flows.pipeline
import flows.tasks
import flows.train_run
from flows.infra.dvc_stages import StageFailed
from flows.infra.work_pools import (
    CLONE_COMMIT_ENV,
    CLONE_URL_ENV,
    PIPELINE_QUEUE,
    RESILIENT_ENV,
    TRAIN_DEPLOYMENT,
    TRAIN_QUEUE,
    TRAIN_REMOTE_DEPLOYMENT,
)
from flows.pipeline import _crashed, is_server, tracking_uri
from flows.tasks import not_user_error, repro_mlflow_stage, repro_stage, wait_for_mlflow


def all_tasks() -> dict[str, Task]:
    found = {}
    for module in (flows.tasks, flows.train_run, flows.pipeline):
        for name, obj in vars(module).items():
            if isinstance(obj, Task):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_no_task_caches_or_keeps_results():
    """DVC alone decides what is stale: a Prefect cache on task inputs could skip a stage DVC would run."""
    tasks = all_tasks()
    assert len(tasks) >= 12
    for name, task in tasks.items():
        assert task.cache_policy is NO_CACHE, name
        assert task.persist_result is False, name
        assert task.cache_key_fn is None, name


def test_the_library_never_imports_prefect():
    """`dvc repro` runs `contextual-bert` commands: importing Prefect there could start an ephemeral server."""
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "src").rglob("*.py")
        if re.search(r"^\s*(import prefect|from prefect)", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []
    code = (
        "import sys, contextual_bert.cli as c; c.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _failed(exc):
    return SimpleNamespace(result=lambda raise_on_failure=False: exc)


def test_retries_are_for_transient_faults_only():
    user = StageFailed(["dvc"], 255, "contextual-bert register: error: reports/eval/x.json: missing\n")
    transient = StageFailed(["dvc"], 255, "requests.exceptions.ConnectionError: refused\n")
    assert not_user_error(None, None, _failed(transient)) is True
    assert not_user_error(None, None, _failed(user)) is False
    assert repro_mlflow_stage.retries == 3 and repro_mlflow_stage.retry_condition_fn is not_user_error
    assert repro_stage.retries == 0
    assert wait_for_mlflow.retries >= 5


def test_a_training_is_retried_only_when_its_infrastructure_crashed():
    assert _crashed(None, None, _failed(flows.pipeline.UnitFailed("x", state_type="CRASHED")))
    assert not _crashed(None, None, _failed(flows.pipeline.UnitFailed("x", state_type="FAILED")))


def test_wait_for_mlflow():
    assert "no server" in wait_for_mlflow.fn("sqlite:////tmp/mlflow.db")
    with pytest.raises(ConnectionError, match="not reachable"):
        wait_for_mlflow.fn(f"http://127.0.0.1:{free_port()}")

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert "up" in wait_for_mlflow.fn(f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()


def test_a_checkout_logs_to_the_parents_mlflow_store(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("mlflow:\n  tracking_uri: sqlite:///mlflow.db\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(tmp_path) == "http://127.0.0.1:5000"
    assert is_server("http://127.0.0.1:5000") and not is_server("sqlite:////x.db")


def test_remote_trainings_clone_the_parents_commit_on_their_worker():
    """The git_clone pull step reads the repository and commit from the run's environment (set by the
    pipeline per run), so the template is resolved on the worker at run time, not at `prefect deploy`."""
    import yaml

    deployments = {d["name"]: d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
    for pool, name in TRAIN_REMOTE_DEPLOYMENT.items():
        d = deployments[name]
        assert d["work_pool"]["name"] == pool
        assert d["entrypoint"] == "flows/train_run.py:train_run_remote"
        assert d["pull"] == [
            {
                "prefect.deployments.steps.git_clone": {
                    "repository": f"{{{{ ${CLONE_URL_ENV} }}}}",
                    "commit_sha": f"{{{{ ${CLONE_COMMIT_ENV} }}}}",
                }
            }
        ]
    for name in ("nightly", "train-run-cpu"):
        assert "pull" not in deployments[name]  # these run in the workspace itself
    # Every deployment's runs retry a server without its database (500) instead of failing.
    assert all(d["work_pool"]["job_variables"]["env"] == RESILIENT_ENV for d in deployments.values())
    assert flows.pipeline.RUN_ENV.items() >= RESILIENT_ENV.items()


def test_flows_that_drive_others_are_queued_apart_from_the_trainings():
    """A worker lost under a training must not take the parent flow with it: the orchestrating
    deployments use the cpu pool's queue `pipeline`, the trainings the queue `default`, so training
    workers can serve only the latter (flows.infra.stack, tests/flows/test_stack.py)."""
    import yaml

    deployments = {d["name"]: d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
    for name in ("nightly", "training", "promotion", "sweep"):
        assert deployments[name]["work_pool"]["work_queue_name"] == PIPELINE_QUEUE, name
    trainings = [*TRAIN_DEPLOYMENT.values(), *TRAIN_REMOTE_DEPLOYMENT.values()]
    for name in trainings:
        assert deployments[name]["work_pool"]["work_queue_name"] == TRAIN_QUEUE, name
    assert set(deployments) == {"nightly", "training", "promotion", "sweep", *trainings}


def test_a_model_the_data_cannot_train_is_said_in_one_plain_line(tmp_path):
    """`make repro`'s line for a unit whose model this data cannot train: why, not a missing report."""
    from contextual_bert.config import NOT_APPLICABLE
    from flows.pipeline import unit_summary

    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    run = tmp_path / "models" / "concat-s2"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(f'{{"{NOT_APPLICABLE}": "the data has no customers"}}')
    assert unit_summary(tmp_path, "concat-2") == "not trained: the data has no customers"
    assert unit_summary(tmp_path, "none-0").startswith("done (no training report at ")
