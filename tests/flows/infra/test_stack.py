"""Past one machine, for real, on one machine: PostgreSQL behind Prefect and MLflow, training units that
share no disk with the pipeline's workspace (fresh clones, a DVC remote), two training workers in
directories of their own (work queue `default`), a worker of its own for the parent flow (queue
`pipeline`), and the faults such a setup must survive.

The stack (flows/infra/stack.py's pieces, as `python -m flows.infra.stack up` starts them): a private PostgreSQL
cluster (initdb + pg_ctl on a free port; as root it runs as the `postgres` user), a Prefect server and
an MLflow server (tracking, registry) on it, MLflow artifacts in a directory given as the artifact
root, a bare git repository and a local-directory DVC remote outside the workspace. The nightly
deployment runs the real pipeline at its tiny size with `fan_out=remote`.

- test_nightly_...: undisturbed; Completed, MLflow runs and champion, an empty `dvc status`, and the
  units ran in clones under the workers' directories, handed only values.
- test_faults_...: the units of that workspace forgotten (records and outputs), the nightly run
  again; one training worker is SIGKILLed (with its process tree, as if its machine died) while it
  trains, and PostgreSQL is stopped for 10 s. The dead worker's unit
  is marked Crashed (no heartbeat) and retried once on the other worker; the run completes, nothing is
  lost, and the results equal the undisturbed run's.

Skipped only where PostgreSQL cannot be installed (never under CI=true, where .ci/run installs it).
Every process started here is ended by a finalizer, also on failure; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from flows.infra import dvc_stages, stack
from flows.infra.work_pools import CPU_POOL, PIPELINE_QUEUE, RESILIENT_ENV, TRAIN_QUEUE
from flows_testkit import (
    SERVER_START_TIMEOUT,
    TINY_PARAMS,
    TINY_VARIANTS,
    VENV_BIN,
    PrefectServer,
    Processes,
    children,
    clean_env,
    cmdline,
    copy_working_tree,
    dvc,
    free_port,
    git,
    kill_tree,
    run,
)

pytestmark = pytest.mark.slow

# Every wait is bounded; the bound only ends a hang. On the shared 2-core machine, niced, an undisturbed
# run took from 222 s to over 600 s (load 8, 18:21), so the bound is generous.
RUN_TIMEOUT = 1200
# Both servers migrate an empty PostgreSQL database first: over 90 s niced at load 11 (18:38).
PG_SERVER_START_TIMEOUT = 4 * SERVER_START_TIMEOUT
WORKERS = ("worker-1", "worker-2")
UNITS = [f"{v}-s{s}" for v in TINY_VARIANTS for s in TINY_PARAMS["train.seeds"]]


@pytest.fixture(scope="module")
def postgres():
    reason = stack.postgres_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests: {reason}")
        pytest.skip(reason)
    # Not under pytest's tmp dir: that one is private to root, and the cluster runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="cb-postgres-"))
    root.chmod(0o755)
    pg = stack.Postgres(root / "data", free_port())
    try:
        pg.init()
        pg.start()
        for db in ("prefect", "mlflow"):
            pg.create_database(db)
        yield pg
    finally:
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def stack_up(postgres, tmp_path_factory):
    """Prefect and MLflow on PostgreSQL, pools and the zombie automation, the remotes, a workspace
    pushed to its origin, `prefect deploy --all`, and two workers in directories of their own."""
    root = tmp_path_factory.mktemp("stack")
    processes = Processes(root / "logs")
    try:
        port, mlflow_port = free_port(), free_port()
        server = PrefectServer(f"http://127.0.0.1:{port}/api", root / "prefect-home", processes)
        proc = processes.start("prefect-server", stack.prefect_server_command(port, scheduler=False), root,
                               {**server.env(), **stack.prefect_server_env(postgres, server.home)})
        mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
        artifacts = root / "mlartifacts"
        mlflow = processes.start("mlflow-server", stack.mlflow_server_command(postgres, mlflow_port, str(artifacts)),
                                 root, clean_env())
        stack.wait_healthy(f"{server.url}/health", PG_SERVER_START_TIMEOUT, "prefect server", proc.alive)
        stack.wait_healthy(f"{mlflow_uri}/health", PG_SERVER_START_TIMEOUT, "mlflow server", mlflow.alive)

        origin, storage = root / "origin.git", root / "dvc-remote"
        run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], root)
        env = server.env(MLFLOW_TRACKING_URI=mlflow_uri)
        template = copy_working_tree(root / "template")
        run([str(VENV_BIN / "python"), "-m", "flows.infra.work_pools", "--cpu-trainings", "2"], template, env)
        dvc(["remote", "add", "-d", "storage", str(storage)], template)
        git(["add", ".dvc/config"], template)
        git(["commit", "-q", "-m", "the DVC remote"], template)
        git(["remote", "add", "origin", str(origin)], template)
        git(["push", "-q", "origin", "main"], template)
        server.cli(["deploy", "--all"], template)

        # The flows that drive the trainings on a worker of their own (queue `pipeline`), as `flows.infra.stack
        # up` starts them: the training workers (queue `default`) can die without taking a parent along.
        (root / "worker-pipeline").mkdir()
        pipeline_worker = server.start_worker(processes, CPU_POOL, root / "worker-pipeline", "worker-pipeline",
                                              queue=PIPELINE_QUEUE, MLFLOW_TRACKING_URI=mlflow_uri, **RESILIENT_ENV)
        workers = {}
        for name in WORKERS:
            wdir = root / name
            (wdir / "tmp").mkdir(parents=True)
            # TMPDIR: each flow run's working directory (its clone) lies in the worker's own directory.
            workers[name] = server.start_worker(processes, CPU_POOL, wdir, name, queue=TRAIN_QUEUE,
                                                MLFLOW_TRACKING_URI=mlflow_uri, TMPDIR=str(wdir / "tmp"),
                                                **RESILIENT_ENV)
        yield {"server": server, "mlflow": mlflow_uri, "root": root, "origin": origin, "storage": storage,
               "artifacts": artifacts, "workers": workers, "pipeline_worker": pipeline_worker,
               "processes": processes, "pg": postgres}
    finally:
        processes.stop_all()


def workspace(stack_up, name: str) -> Path:
    """A clone of the origin: the pipeline's workspace (the nightly run's `workdir`)."""
    ws = stack_up["root"] / name
    run(["git", "clone", "-q", str(stack_up["origin"]), str(ws)], stack_up["root"])
    return ws


def start_nightly(stack_up, ws: Path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = stack_up["server"]
    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        with get_client(sync_client=True) as client:
            nightly = client.read_deployment_by_name("pipeline/nightly")
        # The deployment runs where it was deployed from; this run works in `ws` instead.
        return run_deployment(
            "pipeline/nightly", timeout=0, as_subflow=False,
            parameters={"size": "tiny", "params": TINY_PARAMS, "fan_out": "remote", "workdir": str(ws),
                        "train_timeout_s": RUN_TIMEOUT},
        ), nightly


def wait_final(stack_up, flow_run_id, during=None):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + RUN_TIMEOUT
    with temporary_settings(updates={PREFECT_API_URL: stack_up["server"].url}):
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                if during is not None:
                    during()
                try:
                    flow_run = client.read_flow_run(flow_run_id)
                except Exception:  # the server's database may be down on purpose
                    time.sleep(3)
                    continue
                if flow_run.state.is_final():
                    return flow_run
                time.sleep(3)
    raise TimeoutError(f"flow run {flow_run_id} not final within {RUN_TIMEOUT} s")


def unit_runs(stack_up, ws: Path, since) -> list:
    """The train-run-remote flow runs started for workspace `ws` after `since`, oldest first, each with
    the report it published (None if it published none)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterType, DeploymentFilter,
                                                DeploymentFilterName, FlowRunFilter, FlowRunFilterId)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    commit = git(["rev-parse", "HEAD"], ws).strip()
    with temporary_settings(updates={PREFECT_API_URL: stack_up["server"].url}):
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=["train-run-remote-cpu"])))
            mine = [r for r in runs if r.created >= since and r.parameters.get("commit") == commit
                    and r.parameters.get("params_yaml") == (ws / "params.yaml").read_text()]
            out = []
            for r in sorted(mine, key=lambda r: r.created):
                arts = client.read_artifacts(
                    artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["unit-report"])),
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id])))
                out.append((r, arts[0].data if arts else None))
    return out


def results(ws: Path) -> dict:
    """What must not depend on where, or how often, the units ran: each unit's evaluation (every
    metric) and its training curve (losses per epoch), less the timings."""
    out = {}
    for unit in UNITS:
        path = ws / "reports/eval" / f"{unit}.json"
        history = json.loads((ws / "models" / unit / "curve.json").read_text())
        out[unit] = {
            "eval": json.loads(path.read_text()),
            "history": [{k: v for k, v in h.items() if k not in ("seconds", "samples_per_s")} for h in history],
        }
    return out


def check_pipeline_outcome(stack_up, ws: Path, flow_run) -> list:
    import mlflow

    assert flow_run.state.is_completed(), f"pipeline ended {flow_run.state.name}: {flow_run.state.message}"
    assert flow_run.work_queue_name == PIPELINE_QUEUE  # the parent ran apart from the trainings
    units = unit_runs(stack_up, ws, since=flow_run.created)
    completed = [(r, rep) for r, rep in units if r.state.is_completed()]
    assert len(completed) == len(TINY_VARIANTS)
    for r, report in completed:
        assert str(ws) not in json.dumps(r.parameters), "a unit was handed a path of the parent"
        where = report["where"].split(":", 1)[1]
        assert any(where.startswith(str(stack_up["root"] / w / "tmp")) for w in WORKERS), where
        assert r.work_queue_name == TRAIN_QUEUE
    assert not (ws / ".dvc/tmp/checkouts").exists()  # no checkout of the parent's workspace was made

    client = mlflow.MlflowClient(tracking_uri=stack_up["mlflow"], registry_uri=stack_up["mlflow"])
    experiment = client.get_experiment_by_name("contextual-bert")
    registry = json.loads((ws / "reports/registry.json").read_text())
    run_ids = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    mine = json.dumps(registry)
    ours = [r for rid, r in run_ids.items() if rid in mine]
    assert sorted(r.data.params.get("variant") for r in ours) == sorted(TINY_VARIANTS)
    assert all(r.info.status == "FINISHED" for r in ours)
    champion = client.get_model_version_by_alias("outfit-completion", "champion")
    assert champion.run_id in run_ids
    assert any(stack_up["artifacts"].rglob("*")), "no MLflow artifact under the artifact root"

    assert dvc_stages.status_all(ws) == {}  # a `dvc repro` would redo nothing (the source stage always runs)
    assert (ws / "reports/table1.md").exists()
    return units


@pytest.fixture(scope="module")
def undisturbed(stack_up):
    ws = workspace(stack_up, "ws")
    started = time.monotonic()
    flow_run, _ = start_nightly(stack_up, ws)
    flow_run = wait_final(stack_up, flow_run.id)
    return ws, flow_run, time.monotonic() - started, results(ws)


def test_nightly_on_postgres_with_units_that_share_no_disk(stack_up, undisturbed):
    ws, flow_run, seconds, _ = undisturbed
    units = check_pipeline_outcome(stack_up, ws, flow_run)
    assert len(units) == len(TINY_VARIANTS)  # no retry without a fault
    print(f"undisturbed nightly run (tiny, fan_out=remote, PostgreSQL): {seconds:.0f} s")


def forget_trainings(ws: Path) -> None:
    """Make every unit stale again, as if never trained: drop their dvc.lock records and outputs."""
    lock = yaml.safe_load((ws / "dvc.lock").read_text())
    lock["stages"] = {k: v for k, v in lock["stages"].items() if not k.startswith(("train@", "evaluate@"))}
    (ws / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    for unit in UNITS:
        shutil.rmtree(ws / "models" / unit)
        (ws / "reports/eval" / f"{unit}.json").unlink()


def test_faults_a_worker_killed_mid_training_and_postgres_down_for_10_s(stack_up, undisturbed):
    ws, _, undisturbed_s, expected = undisturbed
    forget_trainings(ws)
    started = time.monotonic()
    flow_run, _ = start_nightly(stack_up, ws)
    workers = stack_up["workers"]
    events: dict = {}

    def training_on(worker) -> bool:
        return any("contextual-bert" in (c := cmdline(p)) and " train " in c for p in children(worker.popen.pid))

    def inject_faults():
        if "killed" not in events:
            for name, worker in workers.items():
                if worker.alive() and training_on(worker):
                    time.sleep(3)  # mid-training, not at its first line
                    events["killed"] = (name, kill_tree(worker.popen.pid), time.monotonic() - started)
                    break
        elif "postgres" not in events:
            pg = stack_up["pg"]
            down = time.monotonic()
            pg.stop("fast")
            time.sleep(10)
            pg.start()
            events["postgres"] = (down - started, time.monotonic() - down)

    flow_run = wait_final(stack_up, flow_run.id, during=inject_faults)
    seconds = time.monotonic() - started
    assert "killed" in events and "postgres" in events, f"faults not injected: {events}"
    assert stack_up["pipeline_worker"].alive()
    killed, _, killed_at = events["killed"]
    survivor = next(n for n in WORKERS if n != killed)

    units = check_pipeline_outcome(stack_up, ws, flow_run)
    crashed = [r for r, _ in units if r.state.is_crashed()]
    assert crashed, [(r.name, r.state.name) for r, _ in units]
    assert len(units) == len(TINY_VARIANTS) + len(crashed)  # each crashed unit retried once, no more
    for dead in crashed:
        retried = [(r, rep) for r, rep in units if r.name == dead.name and r.state.is_completed()]
        assert len(retried) == 1, dead.name
        assert str(stack_up["root"] / survivor) in retried[0][1]["where"]
    assert results(ws) == expected, "the disturbed run's results differ from the undisturbed run's"
    print(f"fault run: worker {killed} killed at {killed_at:.0f} s, PostgreSQL down at "
          f"{events['postgres'][0]:.0f} s for {events['postgres'][1]:.0f} s, {len(crashed)} unit(s) retried, "
          f"completed in {seconds:.0f} s (undisturbed: {undisturbed_s:.0f} s)")
