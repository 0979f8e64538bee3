"""Learning curve on planted data: the gap of [None] and of a context variant to their Bayes optimum as the
number of outfits grows. If the gap does not shrink with more data, the training recipe is wrong.

For every size, a project of its own under --workdir (params.yaml's settings, `ingest.source: planted`,
`planted.n_outfits` = the size, paths inside the project) runs the pipeline's own stages through the CLI:
ingest -> validate -> features -> train + evaluate (each variant, one seed) -> baseline -> optimum. The
planted truth is the same at every size (same seed, catalogue and customers), so the optimum is comparable.

    python benchmarks/learning_curve.py --sizes 20000 50000 150000 \
        --variants none global_state bag_of_items bag_of_items_context --jobs 2

The training budget is set in optimizer steps, not epochs: a size trains for at most --step-budget steps
(max_epochs = that many steps' worth of epochs, never more than params.yaml's train.max_epochs), so the
cosine decay ends within the budget at every size, and early stopping still ends a run that overfits.
Trainings of one size run --jobs at a time, one torch thread each (on 2 CPU cores two one-thread trainings
run at nearly twice the throughput of one two-thread training).

Writes reports/learning_curve/learning_curve.json and learning_curve.png, and the largest size's Table 1
(the pipeline's own `report` stage, with the optimum rows) as reports/learning_curve/table1.md. Each size's
project stays under --workdir.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONTEXT_FREE = ("none", "bag_of_items")


def project_params(base: dict, root: Path, size: int, variants: list[str], seed: int, threads: int,
                   max_epochs: int | None = None) -> dict:
    params = json.loads(json.dumps(base))  # a deep copy
    params["paths"] = {name: str(root / Path(value)) for name, value in base["paths"].items()}
    params["ingest"]["source"] = "planted"
    params.setdefault("planted", {})["n_outfits"] = size
    params["train"].update(variants=variants, seeds=[seed], num_threads=threads)
    if max_epochs is not None:
        params["train"]["max_epochs"] = max_epochs
    params["mlflow"]["tracking_uri"] = f"sqlite:///{root / 'mlflow.db'}"
    return params


def epochs_for(base: dict, n_train: int, step_budget: int | None) -> int:
    """train.max_epochs, or fewer: as many epochs as fit into step_budget optimizer steps."""
    max_epochs = base["train"]["max_epochs"]
    if step_budget is None:
        return max_epochs
    steps_per_epoch = math.ceil(n_train / base["train"]["batch_size"])
    return max(1, min(max_epochs, step_budget // steps_per_epoch))


def run_size(base: dict, workdir: Path, size: int, variants: list[str], seed: int, threads: int,
             jobs: int = 1, step_budget: int | None = None) -> dict:
    root = workdir / f"n{size}"
    root.mkdir(parents=True, exist_ok=True)
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(project_params(base, root, size, variants, seed, threads)))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
           "OMP_NUM_THREADS": str(threads or 1)}  # fmt: skip
    timings = {}

    def stage(*args: str) -> None:  # each stage a process of its own, as `dvc repro` runs them
        started = time.perf_counter()
        command = [sys.executable, "-m", "contextual_bert.cli", "--params", str(params_path), *args]
        log = root / "logs" / f"{'_'.join(args).replace('--', '')}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "w") as out:
            if subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"size {size}: `contextual-bert {' '.join(args)}` failed (see {log})")
        timings[" ".join(args)] = round(time.perf_counter() - started, 1)

    stage("ingest")
    stage("validate")
    stage("features")
    manifest = json.loads((root / Path(base["paths"]["features_dir"]) / "manifest.json").read_text())
    max_epochs = epochs_for(base, manifest["rows"]["train"], step_budget)
    params_path.write_text(yaml.safe_dump(project_params(base, root, size, variants, seed, threads, max_epochs)))
    stage("baseline")
    stage("optimum")

    def train_and_evaluate(variant: str) -> None:
        stage("train", "--variant", variant, "--seed", str(seed))
        stage("evaluate", "--variant", variant, "--seed", str(seed))

    from mlflow import MlflowClient

    from contextual_bert.tracking import experiment_id

    # the store's tables and the experiment exist before trainings log at once (SQLite migrations race)
    experiment_id(MlflowClient(env["MLFLOW_TRACKING_URI"]), base["mlflow"]["experiment"])
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads that wait on processes
        list(pool.map(train_and_evaluate, variants))
    stage("report")

    reports = root / Path(base["paths"]["reports_dir"])
    read = lambda name: json.loads((reports / "eval" / f"{name}.json").read_text())  # noqa: E731
    optimum = {"with_context": read("optimum_context")["test"], "without_context": read("optimum_no_context")["test"]}
    popularity = read("popularity")["test"]
    rows = {}
    for variant in variants:
        test = read(f"{variant}-s{seed}")["test"]
        reference = optimum["without_context" if variant in CONTEXT_FREE else "with_context"]
        trained = json.loads((root / Path(base["paths"]["models_dir"]) / f"{variant}-s{seed}" / "metrics.json").read_text())
        rows[variant] = {
            "cross_entropy": test["cross_entropy"], "recall@5": test["recall@5"],
            "gap_to_optimum": test["cross_entropy"] - reference["cross_entropy"],
            "converged": trained.get("converged"), "best_epoch": trained.get("best_epoch"),
            "epochs": trained.get("epochs"), "train_seconds": trained.get("seconds"),
        }
    return {"n_outfits": size, "rows": manifest.get("rows"), "max_epochs": max_epochs, "popularity": popularity,
            "optimum": optimum, "variants": rows, "seconds": timings}


def plot(points: list[dict], variants: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    sizes = [p["n_outfits"] for p in points]
    for variant in variants:
        ax.plot(sizes, [p["variants"][variant]["gap_to_optimum"] for p in points], marker="o", label=variant)
    ax.axhline(0.10, color="grey", linestyle="--", linewidth=1, label="0.10 nats")
    ax.set_xscale("log")
    ax.set_xlabel("outfits (log scale)")
    ax.set_ylabel("test cross-entropy minus its optimum (nats)")
    ax.set_title("Gap to the Bayes optimum on planted data")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 50_000, 150_000])
    parser.add_argument("--variants", nargs="+",
                        default=["none", "global_state", "bag_of_items", "bag_of_items_context"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    parser.add_argument("--step-budget", type=int, default=24_000,
                        help="optimizer steps a size trains for at most (0: train.max_epochs epochs)")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/contextual-bert-learning-curve"))
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "learning_curve")
    args = parser.parse_args()

    base = yaml.safe_load(args.params.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    points = []
    for size in sorted(args.sizes):
        points.append(run_size(base, args.workdir, size, args.variants, args.seed, args.threads, args.jobs,
                               args.step_budget or None))
        reports = args.workdir / f"n{size}" / Path(base["paths"]["reports_dir"])
        shutil.copyfile(reports / "table1.md", args.out / "table1.md")  # the largest size so far
        result = {"variants": args.variants, "seed": args.seed, "step_budget": args.step_budget or None,
                  "points": points,
                  "gap_shrinks": {v: all(a["variants"][v]["gap_to_optimum"] > b["variants"][v]["gap_to_optimum"]
                                          for a, b in zip(points, points[1:])) for v in args.variants}}
        (args.out / "learning_curve.json").write_text(json.dumps(result, indent=2))  # after every size
        plot(points, args.variants, args.out / "learning_curve.png")
        print(json.dumps({"n_outfits": size, **{v: points[-1]["variants"][v] for v in args.variants}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
