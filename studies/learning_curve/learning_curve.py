"""Learning curve on planted data: the gap of [None] and of a context variant to their Bayes optimum as the
number of outfits grows. If the gap does not shrink with more data, the training recipe is wrong.

For every size, a project of its own under --workdir (params.yaml's settings, `ingest.source: planted`,
`planted.n_outfits` = the size, paths inside the project) runs the pipeline's own stages through the CLI:
ingest -> validate -> features -> train + evaluate (each model, one seed) -> baseline -> optimum. The
planted truth is the same at every size (same seed, catalogue and customers), so the optimum is comparable.

    python studies/learning_curve/learning_curve.py --sizes 20000 50000 150000 \
        --models none global_state bag_of_items bag_of_items_context --jobs 2

The training budget is set in optimizer steps, not epochs: a size trains for at most --step-budget steps
(max_epochs = that many steps' worth of epochs, never more than params.yaml's train.max_epochs), so the
cosine decay ends within the budget at every size, and early stopping still ends a run that overfits. Steps
are counted at train.batch_size: a model with a batch size of its own (`per_model:`) trains the same number
of epochs, so 4x the batch takes a quarter of the steps.
Trainings of one size run --jobs at a time, one torch thread each (on 2 CPU cores two one-thread trainings
run at nearly twice the throughput of one two-thread training).

Records in the results file (--out, default the study's results.json) <run>/learning_curve (--run, default ids)
and the largest size's Table 1 (the pipeline's own `report` stage, with the optimum rows; one string a line) as
<run>/table1; --plot draws the curve. Each size's project stays under --workdir.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert.config import base_model  # noqa: E402
from contextual_bert.evaluation import OUTFITS_KEY, paired_difference  # noqa: E402
from studies.project import Project, record, relocated  # noqa: E402

CONTEXT_FREE = ("none", "bag_of_items")  # read against the optimum without the context (and "_attrs" twins)


def project_params(
    base: dict, root: Path, size: int, models: list[str], seed: int, threads: int, max_epochs: int | None = None
) -> dict:
    params = relocated(base, root)
    params["ingest"]["source"] = "planted"
    params.setdefault("planted", {})["n_outfits"] = size
    params["train"].update(models=models, seeds=[seed], num_threads=threads)
    if max_epochs is not None:
        params["train"]["max_epochs"] = max_epochs
    return params


def epochs_for(base: dict, n_train: int, step_budget: int | None) -> int:
    """train.max_epochs, or fewer: as many epochs as fit into step_budget optimizer steps of train.batch_size."""
    max_epochs = base["train"]["max_epochs"]
    if step_budget is None:
        return max_epochs
    steps_per_epoch = math.ceil(n_train / base["train"]["batch_size"])
    return max(1, min(max_epochs, step_budget // steps_per_epoch))


def paired_cross_entropy(b: dict, a: dict) -> dict:
    """Paired bootstrap of the test cross-entropy, a against b (positive: a better), from their evaluations'
    per-outfit records."""
    records = (b.get(OUTFITS_KEY), a.get(OUTFITS_KEY))
    return {"why": "no per-outfit record"} if None in records else paired_difference(*records, "cross_entropy")


def paired(results: dict[str, dict]) -> dict:
    """Paired bootstrap over the test outfits of the test cross-entropy, "a vs b" (positive: a better), for the
    pairs the issue asks about among the models run: [None] against the bag of items, each context variant
    against [None] and against the bag of items + c (each with its "_attrs" twin where both ran with it)."""
    pairs = []
    for model in results:
        suffix = model.removeprefix(base_model(model))
        if base_model(model) == "none":
            pairs.append((model, "bag_of_items" + suffix))
        elif base_model(model) not in CONTEXT_FREE + ("bag_of_items_context",):
            pairs += [(model, "none" + suffix), (model, "bag_of_items_context" + suffix)]
    out = {}
    for a, b in pairs:
        if b in results:
            out[f"{a} vs {b}"] = paired_cross_entropy(results[b], results[a])
    return out


def run_size(
    base: dict,
    workdir: Path,
    size: int,
    models: list[str],
    seed: int,
    threads: int,
    jobs: int = 1,
    step_budget: int | None = None,
) -> dict:
    root = workdir / f"n{size}"
    project = Project(root, project_params(base, root, size, models, seed, threads), threads)
    for stage in ("ingest", "validate", "features"):
        project.stage(stage)
    manifest = json.loads((project.path("features_dir") / "manifest.json").read_text())
    max_epochs = epochs_for(base, manifest["rows"]["train"], step_budget)
    project.write_params(project_params(base, root, size, models, seed, threads, max_epochs))
    project.stage("baseline")
    project.stage("optimum")
    project.train_and_evaluate([(m, seed) for m in models], jobs)
    project.stage("report")

    evals = project.path("reports_dir") / "eval"
    read = lambda name: json.loads((evals / f"{name}.json").read_text())  # noqa: E731
    optimum = {"with_context": read("optimum_context")["test"], "without_context": read("optimum_no_context")["test"]}
    popularity = read("popularity")["test"]
    # with article attributes on: popularity among the articles whose product type is not yet in the outfit
    by_attribute = read("popularity_attribute") if (evals / "popularity_attribute.json").is_file() else None
    rows, results = {}, {}
    for model in models:
        result = results[model] = read(f"{model}-s{seed}")
        test = result["test"]
        reference = optimum["without_context" if base_model(model) in CONTEXT_FREE else "with_context"]
        trained = json.loads((project.path("models_dir") / f"{model}-s{seed}" / "metrics.json").read_text())
        rows[model] = {
            "cross_entropy": test["cross_entropy"],
            "recall@5": test["recall@5"],
            "gap_to_optimum": test["cross_entropy"] - reference["cross_entropy"],
            "converged": trained.get("converged"),
            "best_epoch": trained.get("best_epoch"),
            "epochs": trained.get("epochs"),
            "train_seconds": trained.get("seconds"),
        }
        if by_attribute is not None:  # paired over the same test cases (the id-only models skip unseen targets)
            rows[model]["better_than_popularity_by_attribute"] = paired_cross_entropy(by_attribute, result)
    point = {
        "n_outfits": size,
        "rows": manifest.get("rows"),
        "max_epochs": max_epochs,
        "popularity": popularity,
        "optimum": optimum,
        "variants": rows,  # the key the records so far have
        "paired": paired(results),
        "seconds": project.timings,
    }
    if by_attribute is not None:
        point["popularity_by_attribute"] = by_attribute["test"] | {"attribute": by_attribute.get("attribute")}
    return point


def plot(points: list[dict], models: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    sizes = [p["n_outfits"] for p in points]
    for model in models:
        ax.plot(sizes, [p["variants"][model]["gap_to_optimum"] for p in points], marker="o", label=model)
    if all("popularity_by_attribute" in p for p in points):  # read against the optimum without the context
        ax.plot(
            sizes,
            [
                p["popularity_by_attribute"]["cross_entropy"] - p["optimum"]["without_context"]["cross_entropy"]
                for p in points
            ],
            color="black",
            linestyle=":",
            label="popularity by product type",
        )
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
    parser.add_argument(
        "--models",
        nargs="+",
        default=["none", "global_state", "bag_of_items", "bag_of_items_context"],
        help="any model names (train.models)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    parser.add_argument(
        "--step-budget",
        type=int,
        default=24_000,
        help="optimizer steps (of train.batch_size) a size trains for at most (0: train.max_epochs epochs)",
    )
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/contextual-bert-learning-curve"))
    parser.add_argument("--run", default="ids", help="the run's key in the results file")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"), help="the results file")
    parser.add_argument("--plot", type=Path, default=None, help="a .png of the gaps (default: none)")
    args = parser.parse_args()

    base = yaml.safe_load(args.params.read_text())
    points = []
    for size in sorted(args.sizes):
        points.append(
            run_size(
                base, args.workdir, size, args.models, args.seed, args.threads, args.jobs, args.step_budget or None
            )
        )
        reports = args.workdir / f"n{size}" / Path(base["paths"]["reports_dir"])
        record(args.out, f"{args.run}/table1", (reports / "table1.md").read_text().splitlines())  # the largest so far
        result = {
            "variants": args.models,  # the key the records so far have
            "seed": args.seed,
            "step_budget": args.step_budget or None,
            "points": points,
            "gap_shrinks": {
                m: all(
                    a["variants"][m]["gap_to_optimum"] > b["variants"][m]["gap_to_optimum"]
                    for a, b in zip(points, points[1:])
                )
                for m in args.models
            },
        }
        record(args.out, f"{args.run}/learning_curve", result)  # after every size
        if args.plot:
            plot(points, args.models, args.plot)
        print(json.dumps({"n_outfits": size, **{m: points[-1]["variants"][m] for m in args.models}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
