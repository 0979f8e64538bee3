"""End to end through Prefect: a real `prefect server start` (127.0.0.1, a free port, a temporary
PREFECT_HOME with SQLite), the pools made by `python -m flows.infra.work_pools`, `prefect deploy --all` from
prefect.yaml, a process worker on the cpu pool, and an `mlflow server`. The nightly deployment is
triggered on tiny data in a temporary copy of the repository (never this workspace) and must end
Completed, with the trainings in MLflow, a champion in the registry, and nothing left for `dvc repro`.

Every process started here is ended by a finalizer, also on failure; every wait is bounded.
"""

from __future__ import annotations

import time

import pytest
from flows_testkit import (
    TINY_MODELS,
    TINY_PARAMS,
    VENV_BIN,
    check_one_off_run,
    clean_env,
    copy_working_tree,
    free_port,
    run,
)

pytestmark = pytest.mark.slow

MODELS, TINY = TINY_MODELS, TINY_PARAMS
RUN_TIMEOUT = 480


@pytest.fixture
def repo_copy(tmp_path):
    return copy_working_tree(tmp_path / "repo")


@pytest.fixture
def mlflow_server(processes, tmp_path):
    """An `mlflow server` (SQLite behind it, so parallel trainings can log), started but not waited for:
    the pipeline's wait-for-mlflow task retries until it answers (a transient fault by design)."""
    port = free_port()
    processes.start(
        "mlflow",
        [
            str(VENV_BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/mlflow-server.db",
            "--artifacts-destination",
            str(tmp_path / "mlflow-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        tmp_path,
        clean_env(),
    )
    return f"http://127.0.0.1:{port}"


def test_nightly_deployment_runs_the_pipeline_on_a_worker(prefect_server, processes, repo_copy, mlflow_server):
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = prefect_server
    env = server.env(MLFLOW_TRACKING_URI=mlflow_server)
    run([str(VENV_BIN / "python"), "-m", "flows.infra.work_pools", "--cpu-trainings", "2"], repo_copy, env)
    server.cli(["deploy", "--all"], repo_copy)
    worker = server.start_worker(processes, "cpu", repo_copy, "cpu-worker-1", MLFLOW_TRACKING_URI=mlflow_server)
    with temporary_settings(updates={PREFECT_API_URL: server.url}), get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("pipeline/nightly")
        assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
        assert nightly.work_pool_name == "cpu"
        assert client.read_deployment_by_name("train-run/train-run-gpu").work_pool_name == "gpu"

    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        flow_run = run_deployment(
            "pipeline/nightly", parameters={"size": "tiny", "params": TINY}, timeout=0, as_subflow=False
        )
        deadline = time.monotonic() + RUN_TIMEOUT
        with get_client(sync_client=True) as client:
            while True:
                flow_run = client.read_flow_run(flow_run.id)
                if flow_run.state.is_final() or time.monotonic() > deadline:
                    break
                assert worker.alive(), worker.tail()
                time.sleep(3)
            state = flow_run.state
            children = client.read_flow_runs()
    assert state.is_completed(), f"pipeline run ended {state.name}: {state.message}\n{worker.tail(120)}"
    trainings = [r for r in children if r.parameters.get("workdir") == str(repo_copy)]
    assert len(trainings) == len(MODELS) and all(r.state.is_completed() for r in trainings)

    # MLflow: a finished, evaluated run per model; the registry has a champion.
    client = mlflow.MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    experiment = client.get_experiment_by_name("contextual-bert")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params.get("model") for r in runs) == sorted(MODELS)
    assert all(r.info.status == "FINISHED" for r in runs)
    champion = client.get_model_version_by_alias("outfit-completion", "champion")
    assert champion.run_id in {r.info.run_id for r in runs}

    # DVC recorded all of it at the run's params, and left params.yaml as it was (the nightly runs what it says).
    check_one_off_run(repo_copy)
    assert (repo_copy / "reports/table1.md").exists()
