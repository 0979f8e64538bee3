"""A project of its own under a work folder: the pipeline's stages run through the CLI with a params file of
its own (paths inside the folder, its own MLflow store), each stage a process, as `dvc repro` runs them.

Used by the benchmarks that need the whole pipeline on other data or settings than params.yaml's
(learning_curve/learning_curve.py: planted data at several sizes; table1_on/table1_on.py: Table 1 on
another data set) without touching the repository's data/, models/ or reports/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml


def relocated(base: dict, root: Path) -> dict:
    """A deep copy of the params `base` whose paths and MLflow store lie under `root`."""
    params = json.loads(json.dumps(base))
    params["paths"] = {name: str(root / Path(value)) for name, value in base["paths"].items()}
    params["mlflow"]["tracking_uri"] = f"sqlite:///{root / 'mlflow.db'}"
    return params


def record(results: Path, key: str, value) -> None:
    """`value` under `key` in a study's results file (one JSON object, an entry per run; keys like
    `<run>/metrics`), the other entries kept: a study keeps one results file, its runs keyed in it."""
    results = Path(results)
    entries = json.loads(results.read_text()) if results.exists() else {}
    entries[key] = value
    results.write_text(json.dumps(dict(sorted(entries.items())), indent=1) + "\n")


def override(params: dict, assignment: str) -> None:
    """`a.b.c=value` (value read as YAML) into params, whose sections must exist: a study's `--set`."""
    key, sep, value = assignment.partition("=")
    *parents, leaf = key.split(".")
    node = params
    for part in parents if sep else ():
        node = node.get(part) if isinstance(node, dict) else None
    if not sep or not isinstance(node, dict):
        raise SystemExit(f"--set {assignment!r}: expected an existing section's key.path=value")
    node[leaf] = yaml.safe_load(value)


class Project:
    """The stages of one project: `stage("train", "--model", v, ...)` runs `contextual-bert train ...` with
    the project's params, its log in root/logs, and fails loudly naming the log."""

    def __init__(self, root: Path, params: dict, threads: int = 1):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.params_path = self.root / "params.yaml"
        # what an earlier run of this project was set to: train_and_evaluate(reuse=True) keeps its models only
        # when it was this
        self.previous_params = yaml.safe_load(self.params_path.read_text()) if self.params_path.exists() else None
        self.write_params(params)
        self.env = {**os.environ, "MLFLOW_TRACKING_URI": params["mlflow"]["tracking_uri"],
                    "OMP_NUM_THREADS": str(threads or 1)}  # fmt: skip
        self.timings: dict[str, float] = {}

    def write_params(self, params: dict) -> None:
        self.params = params
        # in params.yaml's key order: the features stage encodes article attributes in their declared order,
        # and that order is the order of the attribute embeddings' initial weights (sorted keys gave another
        # initialisation than `make repro`'s)
        self.params_path.write_text(yaml.safe_dump(params, sort_keys=False))

    def path(self, key: str) -> Path:
        """A folder of params' `paths:` (e.g. reports_dir), inside the project."""
        return Path(self.params["paths"][key])

    def stage(self, *args: str) -> None:
        started = time.perf_counter()
        command = [sys.executable, "-m", "contextual_bert.cli", "--params", str(self.params_path), *args]
        log = self.root / "logs" / f"{'_'.join(args).replace('--', '')}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "w") as out:
            if subprocess.run(command, env=self.env, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"{self.root}: `contextual-bert {' '.join(args)}` failed (see {log})")
        self.timings[" ".join(args)] = round(time.perf_counter() - started, 1)

    def check_reusable(self) -> None:
        """Refuse to reuse the models of an earlier call whose settings were other than these."""
        if self.previous_params is not None and _setting(self.previous_params) != _setting(self.params):
            self.write_params(self.previous_params)  # the models' settings stay on record
            raise SystemExit(f"{self.params_path}: --reuse, but this project was trained with other settings")

    def train_and_evaluate(self, runs: list[tuple[str, int]], jobs: int, reuse: bool = False) -> None:
        """Train and evaluate every (model, seed), `jobs` at a time (one torch thread each: on a 2-core CPU
        two one-thread trainings run at nearly twice the throughput of one two-thread training). reuse: a run
        an earlier call trained (its checkpoint there) is evaluated again, not trained again; only when that
        call's settings were these, but for the runs' list and threads."""
        if reuse:
            self.check_reusable()
        from mlflow import MlflowClient

        from contextual_bert.config import Config
        from contextual_bert.registry import experiment_id

        # the store's tables and the experiment exist before trainings log at once (SQLite migrations race)
        experiment_id(MlflowClient(self.env["MLFLOW_TRACKING_URI"]), self.params["mlflow"]["experiment"])

        config = Config.model_validate(self.params)

        def one(run: tuple[str, int]) -> None:
            model, seed = run
            if not (reuse and (config.run_dir(model, seed) / "checkpoint.pt").exists()):
                self.stage("train", "--model", model, "--seed", str(seed))
            self.stage("evaluate", "--model", model, "--seed", str(seed))

        with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads that wait on processes
            list(pool.map(one, runs))


def _setting(params: dict) -> dict:
    """params without what says which runs and on how many threads, not how they are trained."""
    train = {k: v for k, v in params["train"].items() if k not in ("models", "seeds", "num_threads")}
    model = params["model"]
    if not params["features"]["history"]["enabled"]:  # how a model would read a history it does not get
        model = {k: v for k, v in model.items() if not k.startswith("history_")}
    return params | {"train": train, "model": model}
