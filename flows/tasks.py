"""Prefect tasks: thin wrappers around `flows.infra.dvc_stages` and `flows.infra.checkouts`.

Every task has `cache_policy=NO_CACHE` and keeps no result: DVC's cache alone decides what is stale,
and a Prefect cache keyed on task inputs could skip a stage whose inputs changed on disk.
Retries are only for transient faults: a stage that talks to MLflow while the server is not reachable
yet; never for a stage that printed a user error (bad data or params).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.infra import checkouts, dvc_stages
from flows.infra.params_file import apply_overrides

TASK_DEFAULTS: dict[str, Any] = dict(cache_policy=NO_CACHE, persist_result=False)


def not_user_error(task, task_run, state) -> bool:
    exc = state.result(raise_on_failure=False)
    return not getattr(exc, "user_error", False)


def log_output(output: str, lines: int = 40) -> None:
    logger = get_run_logger()
    for line in output.strip().splitlines()[-lines:]:
        logger.info(line)


@task(name="apply-params", **TASK_DEFAULTS)
def apply_params(workdir: Path, overrides: dict) -> dict:
    """Write the run's parameter overrides into params.yaml (DVC then sees what changed); the flow restores
    params.yaml when the run ends (params_file.one_off)."""
    changed = apply_overrides(Path(workdir) / "params.yaml", overrides)
    get_run_logger().info("params.yaml: %s", changed or "unchanged")
    return changed


@task(name="plan-stages", **TASK_DEFAULTS)
def plan_stages(workdir: Path) -> dvc_stages.Plan:
    p = dvc_stages.load_plan(Path(workdir))
    get_run_logger().info("before: %s; %d training units; after: %s", list(p.before), len(p.units), list(p.after))
    return p


def _repro_run_name() -> str:
    from prefect.runtime import task_run

    stage = task_run.parameters["stage"]
    return "dvc repro " + (stage if isinstance(stage, str) else " ".join(stage))


@task(name="dvc-repro", task_run_name=_repro_run_name, **TASK_DEFAULTS)
def repro_stage(stage: str | list[str], workdir: Path, env: dict[str, str] | None = None) -> str:
    """`dvc repro --single-item <stage>...` in `workdir`; DVC skips a stage when nothing it depends on
    changed. A training unit passes its stages together (train, then evaluate: one `dvc` command).
    `env`: variables added to the stage's environment."""
    output = dvc_stages.repro(stage, Path(workdir), dvc_stages.stage_env(Path(workdir), env))
    log_output(output)
    return output


# The same, retried: for stages that talk to the MLflow server (a restart, a server not up yet).
repro_mlflow_stage = repro_stage.with_options(
    name="dvc-repro-mlflow", retries=3, retry_delay_seconds=[10, 30, 60], retry_condition_fn=not_user_error
)


@task(name="stale-units", **TASK_DEFAULTS)
def stale_units(units: list[tuple[str, ...]], workdir: Path) -> list[tuple[str, ...]]:
    """The units in which DVC finds at least one stale stage (one `dvc status` for all)."""
    changes = dvc_stages.stale([s for unit in units for s in unit], Path(workdir))
    todo = [tuple(unit) for unit in units if any(s in changes for s in unit)]
    get_run_logger().info(
        "%d of %d training units stale per DVC: %s", len(todo), len(units), [dvc_stages.unit_key(u[0]) for u in todo]
    )
    return todo


@task(name="check-fresh", **TASK_DEFAULTS)
def require_fresh(stages: list[str], workdir: Path) -> None:
    """Fail when an upstream stage is stale (for flows that must not redo it, e.g. training only)."""
    changes = dvc_stages.stale(stages, Path(workdir))
    if changes:
        raise RuntimeError(
            f"stale upstream stages {sorted(changes)}: run the pipeline deployment (or `dvc repro`) first"
        )


@task(name="bring-back", task_run_name="bring back {key}", **TASK_DEFAULTS)
def bring_back(key: str, checkout: Path, workdir: Path, stages: tuple[str, ...]) -> list[str]:
    """Copy a unit's outputs from its checkout and `dvc commit` them here; then drop the checkout."""
    brought = checkouts.bring_back(Path(checkout), Path(workdir), stages)
    checkouts.remove_checkout(Path(workdir), Path(checkout))
    return brought


@task(name="check-brought-back", **TASK_DEFAULTS)
def check_brought_back(workdir: Path, stages: list[str]) -> None:
    """Every unit brought back is up to date here (`checkouts.refuse_stale`: one `dvc status`)."""
    checkouts.refuse_stale(Path(workdir), stages)


@task(name="wait-for-mlflow", retries=6, retry_delay_seconds=[2, 5, 10, 20, 30, 60], **TASK_DEFAULTS)
def wait_for_mlflow(tracking_uri: str) -> str:
    """Fail (and so retry) until an MLflow server answers; a sqlite or file store needs no server."""
    if not tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri}: no server to wait for"
    url = tracking_uri.rstrip("/") + "/health"
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"MLflow server {tracking_uri} not reachable: {exc}") from exc
    return f"{tracking_uri}: up ({time.monotonic() - started:.1f} s)"
