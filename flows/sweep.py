"""The per-model sweep through DVC experiments, as a DVC user runs it by hand:

    dvc exp run --queue -n sweep-none-0 -S ++per_model.none.learning_rate=0.001 train@none-0   (one per setting)
    dvc queue start -j <jobs>      # then wait until the queue is empty
    dvc exp show --json            # every experiment's params and reports/train/<run>.json

then the setting with the lowest validation cross-entropy of each model is written to `per_model:` in
params.yaml (contextual_bert.sweep chooses; nothing is chosen on test) and the table and plot go to
reports/sweep/. `dvc repro` afterwards re-trains exactly the models whose settings changed: DVC, not
this flow, decides what is stale.

    python -m flows.sweep [--jobs 2 --threads 1] [--no-apply]      # or the Prefect deployment `sweep`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger, task

from contextual_bert.config import load_config
from contextual_bert.sweep import choose, experiments, rows_from_exp_show, write_report
from flows import one_line_errors
from flows.infra.dvc_stages import run_dvc
from flows.infra.params_file import apply_overrides
from flows.tasks import TASK_DEFAULTS


def _queued_or_running(workdir: Path) -> int:
    status = run_dvc(["queue", "status"], workdir)
    return sum(1 for line in status.splitlines() if " Queued " in f" {line} " or " Running " in f" {line} ")


def queue_experiments(workdir: Path, threads: int = 0) -> list[str]:
    """`dvc exp run --queue` once per (model, setting) of params.yaml's sweep section. `threads` > 0 sets
    train.num_threads in the experiments (a stage param: the thread count changes the rounding, so
    such an experiment is compared with others at the same threads)."""
    names = []
    for planned in experiments(load_config(workdir / "params.yaml")):
        set_params = planned["set_params"] + ([f"train.num_threads={threads}"] if threads > 0 else [])
        sets = [arg for p in set_params for arg in ("-S", p)]
        run_dvc(["exp", "run", "--queue", "-n", planned["name"], *sets, planned["target"]], workdir)
        names.append(planned["name"])
    return names


def run_queue(workdir: Path, jobs: int, poll_s: float = 5.0) -> None:
    """`dvc queue start -j jobs`, wait until nothing is queued or running, then `dvc queue stop`.

    `dvc queue start` leaves detached workers that keep its stdout and stderr open: reading them (as `run_dvc`
    does) waits until the last worker exits, which a worker left idle never does (the sweep hung so, once).
    Its output goes to a log file instead, and the workers are stopped when the queue is done."""
    log = Path(workdir) / ".dvc" / "tmp" / "sweep-queue-start.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    run_dvc(["queue", "start", "-j", str(jobs)], workdir, log=log)
    while _queued_or_running(workdir):
        time.sleep(poll_s)
    run_dvc(["queue", "stop"], workdir)


def choose_and_apply(workdir: Path, apply: bool) -> dict:
    cfg = load_config(workdir / "params.yaml")
    rows = rows_from_exp_show(json.loads(run_dvc(["exp", "show", "--json", "-A"], workdir)), cfg)
    expected = {e["name"] for e in experiments(cfg)}
    missing = sorted(expected - {r["experiment"] for r in rows})
    if missing:
        raise RuntimeError(f"sweep experiments without a result: {missing} (see `dvc queue logs <name>`)")
    choice = choose(rows)
    write_report(rows, choice, workdir / cfg.paths.reports_dir / "sweep")
    if apply:
        overrides = {f"per_model.{v}.{k}": value for v, setting in choice.items() for k, value in setting.items()}
        apply_overrides(workdir / "params.yaml", overrides)
    return choice


def run_sweep(
    workdir: str = ".",
    jobs: int = 1,
    apply: bool = True,
    threads: int = 0,
    steps=(queue_experiments, run_queue, choose_and_apply),
    log=print,
) -> dict:
    """Queue, run and read back the sweep; write the winners into params.yaml (unless apply is false).
    On a small CPU, jobs=2 with threads=1 trains two experiments at once, one core each."""
    queue, run, choose_settings = steps
    root = Path(workdir).resolve()
    names = queue(root, threads)
    log(f"queued {len(names)} experiments")
    run(root, jobs)
    choice = choose_settings(root, apply)
    log(f"chosen: {choice}")
    return choice


@flow(name="sweep", log_prints=True)
def sweep(workdir: str = ".", jobs: int = 1, apply: bool = True, threads: int = 0) -> dict:
    """The sweep as a Prefect flow (deployment `sweep`): the same steps, each a task."""
    steps = tuple(
        task(name=name, **TASK_DEFAULTS)(fn)
        for name, fn in (
            ("queue-sweep", queue_experiments),
            ("run-queue", run_queue),
            ("choose-settings", choose_and_apply),
        )
    )
    return run_sweep(workdir, jobs, apply, threads, steps, log=lambda message: get_run_logger().info(message))


@one_line_errors("python -m flows.sweep")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run at once (dvc queue start -j)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per experiment (0: its params)")
    parser.add_argument("--no-apply", action="store_true", help="report the choice, leave params.yaml as is")
    args = parser.parse_args(argv)
    print(json.dumps(run_sweep(args.workdir, args.jobs, not args.no_apply, args.threads), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
