"""The training flow: one flow run per variant and seed, in its own checkout, on a cpu or gpu worker.

Deployed twice (prefect.yaml): `train-run/train-run-cpu` on the `cpu` pool and `train-run/train-run-gpu`
on the `gpu` pool. The pipeline flow picks the deployment (`flows.work_pools.place`) and passes the
device in the run's job variables (`CUDA_VISIBLE_DEVICES`), which the worker puts in this process's
environment and so in every stage's.

Why a checkout: DVC allows one `dvc` command per workspace at a time, so parallel trainings cannot share
the parent's workspace. This flow makes a `git worktree` of the parent's repository (with its
uncommitted changes and the shared DVC cache, `flows/checkouts.py`), links the upstream outputs in, and
runs `dvc repro --single-item train@<variant>-<seed>` and `evaluate@...` there. DVC decides whether
they are stale. The parent then brings the outputs back and `dvc commit`s them, in series, so a later
`dvc repro` in the parent finds them up to date.

While the stages run the flow holds one slot of its concurrency limit (`gpu-<i>`: one training per GPU;
`train-cpu`: N trainings on the CPU workers).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.concurrency.sync import concurrency

from flows import checkouts
from flows.tasks import TASK_DEFAULTS, log_output, repro_stage
from flows.work_pools import TRAIN_FLOW


@task(name="prepare-checkout", **TASK_DEFAULTS)
def prepare_checkout(workdir: Path, checkout: Path) -> str:
    path = checkouts.create_checkout(Path(workdir), Path(checkout))
    get_run_logger().info("checkout %s of %s (shared DVC cache)", path, workdir)
    return str(path)


@task(name="link-inputs", **TASK_DEFAULTS)
def link_inputs(checkout: Path, stages: list[str]) -> None:
    log_output(checkouts.checkout_inputs(Path(checkout), stages))


def train_unit(
    stages: list[str],
    workdir: Path,
    checkout: Path,
    slot: str | None = None,
    slot_timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """Run one unit's stages in its own checkout; called by the flow below or, without deployments, by
    the pipeline flow directly. `env`: added to the stages' environment (deployments pass it through the
    run's job variables instead)."""
    prepare_checkout(workdir, checkout)
    guard = (
        concurrency(slot, occupy=1, strict=True, timeout_seconds=slot_timeout_s) if slot else nullcontext()
    )
    with guard:
        if slot:
            get_run_logger().info("holding concurrency slot %s", slot)
        link_inputs(checkout, stages)
        for stage in stages:
            repro_stage(stage, checkout, env)
    return list(stages)


@flow(name=TRAIN_FLOW, log_prints=True)
def train_run(
    stages: list[str],
    workdir: str,
    checkout: str,
    slot: str | None = None,
    slot_timeout_s: float | None = None,
) -> list[str]:
    """Train (and evaluate) one variant and seed in its own checkout of `workdir`.

    stages: the DVC stages of the unit, e.g. ["train@none-0", "evaluate@none-0"].
    workdir: the parent's DVC workspace (absolute); checkout: where this run's worktree goes.
    slot: the global concurrency limit held while training (`gpu-0`, `train-cpu`); it must exist.
    """
    return train_unit(stages, Path(workdir), Path(checkout), slot, slot_timeout_s)
