"""The pipeline flows: the whole DVC pipeline, training only, and promotion. Deployed by prefect.yaml.

The flows hold no model or data logic: every step is a DVC stage, i.e. one `contextual-bert <stage>`
command, run as `dvc repro --single-item <stage>` so that DVC alone decides what is stale (its cache,
never a Prefect one). The parent's workspace takes one `dvc` command at a time (DVC's lock), so:

1. source, ingest, validate, features (every ancestor of a training) run in series in the parent's workspace;
2. the train and evaluate stages fan out, one flow run per model and seed (`flows/train_run.py`),
   each in its own git worktree sharing the DVC cache, to the `gpu` pool when a GPU worker is up and
   to the `cpu` pool otherwise (`flows/infra/work_pools.py`); only units DVC finds stale are sent;
3. as each training run completes, the parent copies its outputs back and `dvc commit`s them, in
   series; a later `dvc repro` finds them up to date (run locally, the next unit is sent off first, so
   its core does not wait for the bring-back);
4. baseline, report, register and promote run in series (MLflow stages retried while the server is
   unreachable).

With `fan_out="remote"` the units share no disk with this workspace (flows/infra/remote.py): each runs in a
fresh clone at this workspace's commit (pushed) on any worker of its pool, takes params.yaml and
dvc.lock as parameters, pulls its inputs from the DVC remote and pushes its outputs there; this flow
pulls them back and `dvc commit`s them as in step 3.

Without training deployments (or with `fan_out="local"`) the units run in threads of this flow
process instead, each still in its own checkout. A Prefect worker may take 15 s or more to exit after
SIGTERM; a unit interrupted that way leaves its checkout under `.dvc/tmp/checkouts/`, which the next
run of that unit replaces.

Run locally: `python -m flows.pipeline --size tiny` (uses PREFECT_API_URL, or an ephemeral server).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.futures import PrefectFuture, as_completed

from contextual_bert.config import NOT_APPLICABLE, load_config
from contextual_bert.data.sources import SOURCES
from flows import one_line_errors, stage_failure
from flows.infra import dvc_stages, remote
from flows.infra.params_file import one_off, pipeline_overrides
from flows.infra.work_pools import (
    CLONE_COMMIT_ENV,
    CLONE_URL_ENV,
    CPU_POOL,
    GPU_POOL,
    HEARTBEAT_S,
    RESILIENT_ENV,
    TRAIN_FLOW,
    TRAIN_REMOTE_DEPLOYMENT,
    TRAIN_REMOTE_FLOW,
    TRAIN_TAG,
    Placement,
    deployments_exist,
    place,
    read_cluster,
)
from flows.tasks import (
    TASK_DEFAULTS,
    apply_params,
    bring_back,
    check_brought_back,
    log_output,
    not_user_error,
    plan_stages,
    repro_mlflow_stage,
    repro_stage,
    require_fresh,
    stale_units,
    wait_for_mlflow,
)
from flows.train_run import REPORT_ARTIFACT, prepare_checkout, train_unit

CHECKOUTS = Path(".dvc/tmp/checkouts")  # inside the parent's workspace; ignored by git and DVC
# A line per stage and per finished training unit, for a person watching: `make repro` prints these (and
# warnings) and sends the rest of the log to a file (flows/repro.py).
progress = logging.getLogger("flows.progress")


def unit_summary(workdir: Path, key: str) -> str:
    """A finished unit's line: its best validation CE, epochs, convergence and time (reports/train/), or why this
    data cannot train the model (its metrics.json, training.trainer.not_applicable)."""
    model, seed = key.rsplit("-", 1)
    cfg = load_config(workdir / "params.yaml")
    path = workdir / cfg.paths.reports_dir / "train" / f"{model}-s{seed}.json"
    try:
        why = json.loads((workdir / cfg.run_dir(model, int(seed)) / "metrics.json").read_text())[NOT_APPLICABLE]
        return f"not trained: {why}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        r = json.loads(path.read_text())
        return (
            f"best validation CE {r['best_val_cross_entropy']:.4f} at epoch {r['best_epoch']} of {r['epochs']}"
            f" ({'converged' if r['converged'] else 'NOT converged'}), {r['seconds']:.0f} s"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return f"done (no training report at {path})"


class UnitFailed(RuntimeError):
    def __init__(self, message: str, state_type: str | None = None):
        super().__init__(message)
        self.state_type = state_type


def _crashed(task, task_run, state) -> bool:
    """Retry a training only when its infrastructure crashed (a worker killed), not when it failed."""
    return getattr(state.result(raise_on_failure=False), "state_type", None) == "CRASHED"


# Each training run sends heartbeats, so a run whose worker died is marked Crashed (work_pools.py), and
# rides out a Prefect server without its database for a while.
RUN_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S), **RESILIENT_ENV}


def _run_unit_deployment(
    key: str, deployment: str, parameters: dict, placement: Placement, env: dict[str, str], timeout_s: float
):
    """Start one training flow run and wait (bounded) until it ends; raise `UnitFailed` unless it
    completed. The device, the MLflow store and the heartbeat reach the run as job variables, which the
    worker puts into the run's environment."""
    run = run_deployment(
        name=deployment,
        parameters=parameters,
        job_variables={"env": {**RUN_ENV, **env, **placement.env}},
        flow_run_name=f"train {key}",
        tags=[TRAIN_TAG, placement.pool, key],
        timeout=timeout_s,
        poll_interval=3,
    )
    assert isinstance(run, FlowRun)  # run_deployment called from sync code returns the run, not a coroutine
    state = run.state
    if state is None or not state.is_final():
        from prefect.states import Cancelling

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)
        raise UnitFailed(f"training {key}: flow run {run.name} did not end within {timeout_s:.0f} s; cancelled")
    if not state.is_completed():
        raise UnitFailed(
            f"training {key}: flow run {run.name} ended {state.name}: {state.message}", state_type=state.type.value
        )
    return run


@task(
    name="train-unit",
    task_run_name="train {key} on {placement.pool}",
    retries=1,
    retry_condition_fn=_crashed,
    **TASK_DEFAULTS,
)
def launch_unit(
    key: str,
    stages: tuple[str, ...],
    placement: Placement,
    workdir: Path,
    checkout: Path,
    env: dict[str, str],
    timeout_s: float,
) -> str:
    """Start the unit's training flow run (a checkout of `workdir`) on its pool and wait until it ends."""
    parameters = {
        "stages": list(stages),
        "workdir": str(workdir),
        "checkout": str(checkout),
        "slot": placement.slot,
        "slot_timeout_s": timeout_s,
    }
    _run_unit_deployment(key, f"{TRAIN_FLOW}/{placement.deployment}", parameters, placement, env, timeout_s)
    return str(checkout)


@task(
    name="train-unit-remote",
    task_run_name="train {key} on {placement.pool}, no shared disk",
    retries=1,
    retry_condition_fn=_crashed,
    **TASK_DEFAULTS,
)
def launch_remote_unit(
    key: str,
    stages: tuple[str, ...],
    placement: Placement,
    state: remote.ParentState,
    env: dict[str, str],
    timeout_s: float,
) -> dict:
    """Start the unit's training flow run in a fresh clone on its pool; return the report it published.

    The git_clone pull step of the deployment reads the repository and commit from the environment."""
    parameters = {"stages": list(stages), **state.as_parameters(), "slot": placement.slot, "slot_timeout_s": timeout_s}
    clone_env = {CLONE_URL_ENV: state.git_url, CLONE_COMMIT_ENV: state.commit}
    run = _run_unit_deployment(
        key, f"{TRAIN_REMOTE_FLOW}/{placement.deployment}", parameters, placement, {**env, **clone_env}, timeout_s
    )
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=[REPORT_ARTIFACT])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
        )
    if len(artifacts) != 1:
        raise UnitFailed(f"training {key}: flow run {run.name} completed with {len(artifacts)} reports, not 1")
    report = artifacts[0].data
    if not isinstance(report, dict):
        raise UnitFailed(f"training {key}: flow run {run.name}'s report is not a JSON object")
    get_run_logger().info("training %s ran at %s", key, report.get("where"))
    return report


@task(name="bring-back-remote", task_run_name="bring back {key} from the DVC remote", **TASK_DEFAULTS)
def bring_back_remote(key: str, report: dict, workdir: Path, dvc_remote: str) -> list[str]:
    return remote.apply_report(workdir, report, dvc_remote)


@task(name="hand-over", **TASK_DEFAULTS)
def hand_over(
    workdir: Path, units: list[tuple[str, ...]], git_remote: str, dvc_remote: str | None
) -> remote.ParentState:
    """What remote units need from this workspace (as values), and their inputs pushed to the DVC remote."""
    state = remote.parent_state(workdir, git_remote, dvc_remote)
    pushed = remote.push_inputs(workdir, units, state.dvc_remote)
    get_run_logger().info(
        "units clone %s at %s; pushed %s to DVC remote %s", state.git_url, state.commit[:12], pushed, state.dvc_remote
    )
    return state


@task(name="train-unit-local", task_run_name="train {key} in this process", **TASK_DEFAULTS)
def run_unit_locally(key: str, stages: tuple[str, ...], workdir: Path, checkout: Path, env: dict[str, str]) -> str:
    """Train a unit in its checkout, which `fan_out_units` has made already (see there)."""
    train_unit(list(stages), workdir, checkout, env=env, prepared=True)
    return str(checkout)


def _resolve_fan_out(fan_out: str, gpu_ready: bool) -> str:
    pools = {CPU_POOL} | ({GPU_POOL} if gpu_ready else set())
    if fan_out == "remote":
        with get_client(sync_client=True) as client:
            if not deployments_exist(client, pools, remote=True):
                raise RuntimeError(
                    f"fan_out='remote' needs the deployments "
                    f"{[f'{TRAIN_REMOTE_FLOW}/{TRAIN_REMOTE_DEPLOYMENT[p]}' for p in sorted(pools)]}:"
                    " `make prefect-deploy`"
                )
        return fan_out
    if fan_out != "auto":
        return fan_out
    with get_client(sync_client=True) as client:
        return "deployments" if deployments_exist(client, pools) else "local"


def tracking_uri(workdir: Path) -> str:
    """The MLflow store every stage logs to: MLFLOW_TRACKING_URI, else params' `mlflow.tracking_uri`,
    with a relative SQLite path made absolute against `workdir` (a checkout must log to the parent's
    store, not to a database of its own that is deleted with it)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or load_config(workdir / "params.yaml").mlflow.tracking_uri
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri[len(prefix) :]).is_absolute():
        uri = prefix + str((workdir / uri[len(prefix) :]).resolve())
    return uri


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def fan_out_units(
    units: list[tuple[str, ...]],
    workdir: Path,
    fan_out: str = "auto",
    timeout_s: float = 24 * 3600,
    max_parallel: int | None = None,
    git_remote: str = "origin",
    dvc_remote: str | None = None,
) -> list[str]:
    """Train the stale units in parallel, each in its own checkout (or, `fan_out="remote"`, its own
    clone on any machine); bring each back as it completes.

    At most `max_parallel` units are in flight (default: all when MLflow is a server; one with a SQLite
    store, which takes one writer at a time). Within that, the concurrency slots decide what runs at
    once. Successful units are committed even when others fail (a rerun redoes only the failed ones);
    the failures are raised at the end.
    """
    logger = get_run_logger()
    todo = stale_units(units, workdir)
    if not todo:
        progress.info("training: all %d units up to date", len(units))
        return []
    uri = tracking_uri(workdir)
    wait_for_mlflow(uri)
    env = {"MLFLOW_TRACKING_URI": uri}
    if max_parallel is None:
        max_parallel = len(todo) if is_server(uri) else 1
        if not is_server(uri):
            logger.warning("MLflow store %s is not a server: trainings run one at a time", uri)
    with get_client(sync_client=True) as client:
        cluster = read_cluster(client)
    mode = _resolve_fan_out(fan_out, cluster.gpu_ready)
    placements = dict(zip(todo, place(len(todo), cluster.gpu_ready, cluster.devices, cluster.pin_devices)))
    state = None
    if mode == "remote":
        if not is_server(uri):
            raise RuntimeError(
                f"fan_out='remote': the MLflow store {uri} is a file here; units elsewhere "
                "need a server (MLFLOW_TRACKING_URI=http://...)"
            )
        placements = {
            u: dataclasses.replace(p, deployment=TRAIN_REMOTE_DEPLOYMENT[p.pool]) for u, p in placements.items()
        }
        state = hand_over(workdir, todo, git_remote, dvc_remote)
    if mode == "local" and max_parallel > 1 and "OMP_NUM_THREADS" not in os.environ:
        # units share this machine's cores; torch threads beyond a unit's share only wait on each other
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max_parallel))
    logger.info(
        "fan-out (%s): %d units, pool %s, %d at a time",
        mode,
        len(todo),
        placements[todo[0]].pool if mode in ("deployments", "remote") else "none",
        max_parallel,
    )
    progress.info("training: %d of %d units stale, %d at a time (%s)", len(todo), len(units), max_parallel, mode)

    brought: list[str] = []
    failures: list[str] = []
    pending = list(todo)
    running: dict = {}

    def launch(unit: tuple[str, ...]) -> None:
        key = dvc_stages.unit_key(unit[0])
        checkout = workdir / CHECKOUTS / key
        fut: PrefectFuture[Any]  # its task's result: the report (remote), else the checkout's path
        if mode == "remote":
            assert state is not None  # handed over before a remote fan-out starts
            fut = launch_remote_unit.submit(key, unit, placements[unit], state, env, timeout_s)
        elif mode == "deployments":
            fut = launch_unit.submit(key, unit, placements[unit], workdir, checkout, env, timeout_s)
        else:
            # Made here, in this thread, with every other write to the parent's workspace: a checkout copies
            # the parent's dvc.lock, which a bring-back rewrites.
            try:
                prepare_checkout(workdir, checkout)
            except Exception as exc:  # a failed unit, as if it had failed in its own thread
                failures.append(f"{key}: {exc}")
                return
            fut = run_unit_locally.submit(key, unit, workdir, checkout, env)
        running[fut] = (key, unit, checkout)

    while pending or running:
        while pending and len(running) < max(1, max_parallel):
            launch(pending.pop(0))
        if not running:
            continue
        fut = next(as_completed(list(running)))
        key, unit, checkout = running.pop(fut)
        fut.wait()  # sets the final state; before that `.state` may lag behind the API
        if mode == "local" and pending and len(running) < max(1, max_parallel):
            launch(pending.pop(0))  # the freed core trains the next unit while this one is brought back
        done = len(todo) - len(pending) - len(running)
        if fut.state.is_completed():
            # In series, in this thread: the only `dvc` commands in the parent's workspace.
            if mode == "remote":
                assert state is not None  # handed over before a remote fan-out starts
                brought += bring_back_remote(key, fut.result(), workdir, state.dvc_remote)
            else:
                brought += bring_back(key, checkout, workdir, unit)
            progress.info("training %d/%d %s: %s", done, len(todo), key, unit_summary(workdir, key))
        else:
            error = fut.result(raise_on_failure=False)
            failures.append(f"{key}: {error}")
            found = stage_failure(error) if isinstance(error, BaseException) else None
            shown = found[1] if found else failures[-1].splitlines()[0]  # one line: the whole error is in the log
            progress.error("training %d/%d %s FAILED: %s", done, len(todo), key, shown)
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(todo)} trainings failed: " + "; ".join(failures))
    if mode != "remote":  # a remote unit's report is checked as it is applied
        check_brought_back(workdir, brought)
    return brought


def _run_series(stages: tuple[str, ...], workdir: Path) -> list[str]:
    """Run stages one after the other in `workdir`; return those DVC found stale and ran."""
    ran = []
    waited = False
    for stage in stages:
        start = time.monotonic()
        if dvc_stages.kind(stage) in dvc_stages.MLFLOW_STAGES:
            if not waited:
                wait_for_mlflow(tracking_uri(workdir))
                waited = True
            output = repro_mlflow_stage(stage, workdir)
        else:
            output = repro_stage(stage, workdir)
        if f"Running stage '{stage}'" in output:
            ran.append(stage)
        progress.info(
            "%s: %s (%.0f s)", stage, "ran" if ran and ran[-1] == stage else "up to date", time.monotonic() - start
        )
    return ran


@task(name="dvc-status", **TASK_DEFAULTS)
def final_status(workdir: Path) -> dict:
    """What DVC would still run after this flow: should be nothing."""
    changes = dvc_stages.status_all(workdir)
    if changes:
        get_run_logger().warning("DVC still finds stale stages: %s", sorted(changes))
    return changes


@task(
    name="contextual-bert",
    task_run_name="contextual-bert {args}",
    retries=3,
    retry_delay_seconds=[10, 30, 60],
    retry_condition_fn=not_user_error,
    **TASK_DEFAULTS,
)
def cli(args: list[str], workdir: Path) -> str:
    """A `contextual-bert` command outside DVC: an operator's action (rollback), or register/promote
    while dvc.yaml has no such stages. Both are idempotent against the registry."""
    proc = subprocess.run(
        ["contextual-bert", *args],
        cwd=workdir,
        env=dvc_stages.stage_env(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if proc.returncode != 0:
        raise dvc_stages.StageFailed(["contextual-bert", *args], proc.returncode, proc.stdout)
    log_output(proc.stdout)
    return proc.stdout


def _register_and_promote(p: dvc_stages.Plan, workdir: Path, promote: bool) -> list[str]:
    """The MLflow end of the pipeline: the register/promote stages of dvc.yaml, or their commands."""
    wanted = ("register", "promote") if promote else ("register",)
    stages = tuple(s for s in p.after if dvc_stages.kind(s) in wanted)
    if stages:
        return _run_series(stages, workdir)
    wait_for_mlflow(tracking_uri(workdir))
    for command in wanted:
        cli([command], workdir)
    return list(wanted)


@flow(name="pipeline", log_prints=True)
def pipeline(
    size: Literal["tiny", "default", "paper"] | None = None,
    source: str | None = None,  # a name in contextual_bert.data.sources.SOURCES (config checks it)
    params: dict[str, Any] | None = None,
    workdir: str = ".",
    fan_out: Literal["auto", "deployments", "local", "remote"] = "auto",
    promote: bool = True,
    train_timeout_s: float = 24 * 3600,
    max_parallel: int | None = None,
    git_remote: str = "origin",
    dvc_remote: str | None = None,
    registry: bool = True,
) -> dict:
    """The whole pipeline: validate, build features, train every model and seed, evaluate, report,
    register and promote. DVC runs only what is stale.

    size / source: `generate.size` / `ingest.source` for this run (None: keep params.yaml's).
    params: more params.yaml overrides as dotted keys, e.g. {"train.seeds": [0], "train.max_epochs": 2}.
    They are written into params.yaml for this run only (so DVC records them in dvc.lock) and taken out again
    when it ends, also when it fails: the next run runs what params.yaml says.
    workdir: the DVC workspace (a git repository); the worker's working directory by default.
    fan_out: "deployments" sends trainings to the train-run deployments, "local" runs them in this
    process, "auto" uses deployments when they exist, "remote" sends them to the train-run-remote
    deployments: fresh clones of git remote `git_remote` at this commit, inputs and outputs through DVC
    remote `dvc_remote` (default: the committed default remote). promote: also promote (else register only).
    registry: False stops after the report: register and promote need MANAGE, which on the stack only the
    promoter holds, outside the workers (docs/security.md).
    train_timeout_s: bound on each training run. max_parallel: trainings in flight at once (default:
    all with an MLflow server, one with a SQLite store).
    """
    wd = Path(workdir).resolve()
    with one_off(wd / "params.yaml"):
        changed = apply_params(wd, pipeline_overrides(size, source, params))
        p = plan_stages(wd)
        ran = _run_series(p.before, wd)
        trained = fan_out_units(list(p.units), wd, fan_out, train_timeout_s, max_parallel, git_remote, dvc_remote)
        ran += _run_series(tuple(s for s in p.after if dvc_stages.kind(s) not in ("register", "promote")), wd)
        if registry:
            ran += _register_and_promote(p, wd, promote)
        stale_left = final_status(wd)
    return {"params_changed": changed, "ran": ran, "trained": trained, "stale": sorted(stale_left)}


@flow(name="training", log_prints=True)
def training(
    params: dict[str, Any] | None = None,
    workdir: str = ".",
    fan_out: Literal["auto", "deployments", "local", "remote"] = "auto",
    train_timeout_s: float = 24 * 3600,
    max_parallel: int | None = None,
    git_remote: str = "origin",
    dvc_remote: str | None = None,
) -> dict:
    """Training only: train and evaluate every stale model and seed, nothing upstream or after.

    Fails when the features (or anything before them) are stale: run the pipeline first.
    params: params.yaml overrides as dotted keys (e.g. {"train.max_epochs": 5}), for this run only.
    """
    wd = Path(workdir).resolve()
    with one_off(wd / "params.yaml"):
        changed = apply_params(wd, params or {})
        p = plan_stages(wd)
        require_fresh(list(p.before), wd)
        trained = fan_out_units(list(p.units), wd, fan_out, train_timeout_s, max_parallel, git_remote, dvc_remote)
    return {"params_changed": changed, "trained": trained}


@flow(name="promotion", log_prints=True)
def promotion(workdir: str = ".", rollback: bool = False) -> dict:
    """Register the evaluated runs in MLflow and promote the best (alias `champion`) if it beats the
    current one; or, with rollback, give `champion` back to the previous version."""
    wd = Path(workdir).resolve()
    if rollback:
        wait_for_mlflow(tracking_uri(wd))
        cli(["promote", "--rollback"], wd)
        return {"ran": ["promote --rollback"]}
    return {"ran": _register_and_promote(plan_stages(wd), wd, promote=True)}


def _override(text: str) -> tuple[str, object]:
    """--set KEY=YAML as (key, value); anything else is argparse's one-line error."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=YAML, e.g. train.seeds=[0]")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not valid YAML ({problem})") from None


@one_line_errors("python -m flows.pipeline")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description="run the pipeline flow here")
    parser.add_argument("--size", choices=["tiny", "default", "paper"])
    parser.add_argument("--source", choices=sorted(SOURCES))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        type=_override,
        help="a params.yaml override for this run only, e.g. --set train.seeds=[0] (repeatable)",
    )
    parser.add_argument("--fan-out", default="auto", choices=["auto", "deployments", "local", "remote"])
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args(argv)
    overrides = dict(args.set)
    result = pipeline(
        size=args.size, source=args.source, params=overrides or None, workdir=args.workdir, fan_out=args.fan_out
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
