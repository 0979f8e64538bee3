"""The training flow: one flow run per model and seed, in its own checkout, on a cpu or gpu worker.

Deployed twice (prefect.yaml): `train-run/train-run-cpu` on the `cpu` pool and `train-run/train-run-gpu`
on the `gpu` pool. The pipeline flow picks the deployment (`flows.infra.work_pools.place`) and passes the
device in the run's job variables (`CUDA_VISIBLE_DEVICES`), which the worker puts in this process's
environment and so in every stage's.

Why a checkout: DVC allows one `dvc` command per workspace at a time, so parallel trainings cannot share
the parent's workspace. This flow makes a `git worktree` of the parent's repository (with its
uncommitted changes and the shared DVC cache, `flows/infra/checkouts.py`), cuts its dvc.lock down to the
unit's part, links the upstream outputs in, and runs
`dvc repro --single-item train@<model>-<seed> evaluate@<model>-<seed>` there. DVC decides whether
they are stale. The parent then brings the outputs and their dvc.lock records back, in series, so a later
`dvc repro` in the parent finds them up to date.

While the stages run the flow holds one slot of its concurrency limit (`gpu-<i>`: one training per GPU;
`train-cpu`: N trainings on the CPU workers).

`train_run_remote` is the same for units that share no disk with the parent (`fan_out="remote"`,
flows/infra/remote.py): deployed as `train-run-remote/train-run-remote-{cpu,gpu}`, whose `git_clone` pull
step clones the repository at the parent's commit into the run's own temporary directory. The run
takes the parent's params.yaml and dvc.lock as parameters, pulls only its inputs from the DVC remote,
runs the stages, pushes the outputs and reports back: the dvc.lock records and the uncached outputs,
as an artifact of type `unit-report` on its flow run, which the parent reads through the Prefect API.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.concurrency.sync import concurrency

from flows.infra import checkouts, remote
from flows.infra.work_pools import TRAIN_FLOW, TRAIN_REMOTE_FLOW, TRAIN_SLOT_LEASE_S
from flows.tasks import TASK_DEFAULTS, log_output, repro_stage

REPORT_ARTIFACT = "unit-report"  # the artifact type a remote unit reports back with


@task(name="prepare-checkout", **TASK_DEFAULTS)
def prepare_checkout(workdir: Path, checkout: Path) -> str:
    path = checkouts.create_checkout(Path(workdir), Path(checkout))
    get_run_logger().info("checkout %s of %s (shared DVC cache)", path, workdir)
    return str(path)


@task(name="link-inputs", **TASK_DEFAULTS)
def link_inputs(checkout: Path, stages: list[str]) -> None:
    log_output(checkouts.checkout_inputs(Path(checkout), stages))


def _slot(slot: str | None, slot_timeout_s: float | None):
    if not slot:
        return nullcontext()
    get_run_logger().info("waiting for concurrency slot %s", slot)
    return concurrency(slot, occupy=1, strict=True, timeout_seconds=slot_timeout_s, lease_duration=TRAIN_SLOT_LEASE_S)


def train_unit(
    stages: list[str],
    workdir: Path,
    checkout: Path,
    slot: str | None = None,
    slot_timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    prepared: bool = False,
) -> list[str]:
    """Run one unit's stages in its own checkout; called by the flow below or, without deployments, by
    the pipeline flow directly. `env`: added to the stages' environment (deployments pass it through the
    run's job variables instead). `prepared`: the checkout exists already (the pipeline flow made it)."""
    if not prepared:
        prepare_checkout(workdir, checkout)
    with _slot(slot, slot_timeout_s):
        link_inputs(checkout, stages)
        repro_stage(list(stages), checkout, env)
    return list(stages)


@flow(name=TRAIN_FLOW, log_prints=True)
def train_run(
    stages: list[str], workdir: str, checkout: str, slot: str | None = None, slot_timeout_s: float | None = None
) -> list[str]:
    """Train (and evaluate) one model and seed in its own checkout of `workdir`.

    stages: the DVC stages of the unit, e.g. ["train@none-0", "evaluate@none-0"].
    workdir: the parent's DVC workspace (absolute); checkout: where this run's worktree goes.
    slot: the global concurrency limit held while training (`gpu-0`, `train-cpu`); it must exist.
    """
    return train_unit(stages, Path(workdir), Path(checkout), slot, slot_timeout_s)


# --- units that share no disk with the parent (flows/infra/remote.py) -----------------------------------


@task(name="prepare-clone", **TASK_DEFAULTS)
def prepare_clone(state: remote.ParentState, clone: Path, make: bool) -> str:
    if make:
        remote.clone_at(state.git_url, state.commit, clone)
    remote.prepare_clone(clone, state)
    get_run_logger().info(
        "fresh clone %s of %s at %s, the parent's params.yaml and dvc.lock", clone, state.git_url, state.commit[:12]
    )
    return str(clone)


@task(name="pull-inputs", **TASK_DEFAULTS)
def pull_inputs(clone: Path, stages: list[str], dvc_remote: str) -> list[str]:
    paths = remote.pull_inputs(Path(clone), stages, dvc_remote)
    get_run_logger().info("pulled from DVC remote %s: %s", dvc_remote, paths)
    return paths


@task(name="push-outputs", **TASK_DEFAULTS)
def push_outputs(clone: Path, stages: list[str], dvc_remote: str) -> dict:
    report = remote.push_outputs(Path(clone), stages, dvc_remote)
    get_run_logger().info(
        "pushed to DVC remote %s: %s; %d uncached files in the report", dvc_remote, stages, len(report["files"])
    )
    return report


def publish_report(report: dict) -> None:
    """Attach the report to this flow run, where the parent reads it (no shared disk needed)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(
                type=REPORT_ARTIFACT,
                data=report,
                flow_run_id=ctx.flow_run.id,
                description=f"dvc.lock records and uncached outputs of {list(report['stages'])}",
            )
        )


def train_unit_remote(
    stages: list[str],
    state: remote.ParentState,
    clone: Path | None = None,
    slot: str | None = None,
    slot_timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """Run one unit in a fresh clone at the parent's commit; return (and publish) its report.

    clone: where to clone; None: this process's working directory is the clone already (made by the
    deployment's git_clone pull step)."""
    make = clone is not None
    here = Path(clone) if clone is not None else Path.cwd()
    prepare_clone(state, here, make)
    with _slot(slot, slot_timeout_s):
        pull_inputs(here, stages, state.dvc_remote)
        repro_stage(list(stages), here, env)
    report = push_outputs(here, stages, state.dvc_remote)
    publish_report(report)
    return report


@flow(name=TRAIN_REMOTE_FLOW, log_prints=True)
def train_run_remote(
    stages: list[str],
    git_url: str,
    commit: str,
    params_yaml: str,
    dvc_lock: str,
    dvc_remote: str,
    slot: str | None = None,
    slot_timeout_s: float | None = None,
    clone: str | None = None,
) -> dict:
    """Train (and evaluate) one model and seed in a fresh clone, sharing no disk with the parent.

    git_url, commit: the repository and the parent's commit (the pull step clones them);
    params_yaml, dvc_lock: the parent's files as text; dvc_remote: the DVC remote to pull and push.
    clone: a directory to clone into (default: this run's working directory is the clone).
    """
    state = remote.ParentState(git_url, commit, params_yaml, dvc_lock, dvc_remote)
    return train_unit_remote(stages, state, Path(clone) if clone else None, slot, slot_timeout_s)
